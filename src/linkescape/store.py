"""A minimal file-backed key-value store for jobs without torch.

It has the methods linkescape uses from a torch.distributed Store: ``set``,
``get`` (blocking until the key exists or the timeout passes) and ``check``.
Keys are files in a directory shared by the ranks (one machine or a shared FS).
"""

from __future__ import annotations

import hashlib
import os
import time
from typing import Iterable

from .errors import RendezvousError


class FileStore:
    def __init__(self, path: str, timeout: float = 300.0) -> None:
        self.path = path
        self.timeout = timeout
        os.makedirs(path, exist_ok=True)

    def _file(self, key: str) -> str:
        return os.path.join(self.path, hashlib.sha1(key.encode()).hexdigest())

    def set(self, key: str, value) -> None:
        data = value if isinstance(value, (bytes, bytearray)) else str(value).encode()
        tmp = f"{self._file(key)}.{os.getpid()}.tmp"
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, self._file(key))  # atomic: readers never see half a value

    def check(self, keys: Iterable[str]) -> bool:
        return all(os.path.exists(self._file(k)) for k in keys)

    def get(self, key: str) -> bytes:
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                with open(self._file(key), "rb") as f:
                    return f.read()
            except FileNotFoundError:
                if time.monotonic() > deadline:
                    raise RendezvousError(f"key {key!r} never appeared in {self.path}") from None
                time.sleep(0.002)
