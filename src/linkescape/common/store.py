"""A minimal file-backed key-value store for jobs without torch.

It has the methods linkescape uses from a torch.distributed Store: ``set``,
``get`` (blocking until the key exists or the timeout passes) and ``check``.
Keys are files in a directory shared by the ranks (one machine or a shared FS).

The store holds the job's per-job secret (``linkescape/secret/<job>``): a
directory it creates is 0700 and every value is written 0600 (a temporary
file created exclusively with that mode, then renamed into place), so other
users of the machine read nothing of it. A directory that exists already
(made by the launcher, or by another rank) is used only if nobody else can
write it (a real directory, ours or root's, no write bit for group or others:
``ConfigError`` otherwise, as OpenSSH's StrictModes refuses such a home).
A value is read without following a symlink and at most ``MAX_VALUE`` bytes.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import time
from typing import Iterable

from .errors import RendezvousError
from .private import check_private_dir

#: the largest value ``get`` reads (linkescape's values are a few hundred bytes)
MAX_VALUE = 1 << 20


class FileStore:
    def __init__(self, path: str, timeout: float = 300.0) -> None:
        self.path = path
        self.timeout = timeout
        parent = os.path.dirname(os.path.abspath(path))
        os.makedirs(parent, exist_ok=True)
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:  # another rank made it, or the launcher did: only if others cannot write it
            check_private_dir(path)
        else:
            os.chmod(path, 0o700)  # whatever the umask

    def _file(self, key: str) -> str:
        return os.path.join(self.path, hashlib.sha1(key.encode()).hexdigest())

    def set(self, key: str, value) -> None:
        data = value if isinstance(value, (bytes, bytearray)) else str(value).encode()
        tmp = f"{self._file(key)}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
        # created here and now, 0600 from the start: never a file another
        # user can read, and never one planted under this name before
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0), 0o600)
        try:
            os.fchmod(fd, 0o600)  # whatever the umask
            with os.fdopen(fd, "wb") as f:
                fd = -1
                f.write(data)
            os.replace(tmp, self._file(key))  # atomic: readers never see half a value
        except BaseException:
            if fd >= 0:
                os.close(fd)
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise

    def check(self, keys: Iterable[str]) -> bool:
        return all(os.path.exists(self._file(k)) for k in keys)

    def get(self, key: str) -> bytes:
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                fd = os.open(self._file(key), os.O_RDONLY | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0))
            except FileNotFoundError:
                if time.monotonic() > deadline:
                    raise RendezvousError(f"key {key!r} never appeared in {self.path}") from None
                time.sleep(0.002)
                continue
            except OSError as exc:
                raise RendezvousError(f"key {key!r} in {self.path}: {exc.strerror} (a symlink is never followed)") \
                    from None
            with os.fdopen(fd, "rb") as f:
                data = f.read(MAX_VALUE + 1)
            if len(data) > MAX_VALUE:
                raise RendezvousError(f"key {key!r} in {self.path} holds more than {MAX_VALUE} bytes: refused")
            return data
