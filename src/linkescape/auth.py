"""The key that authenticates a job's links.

- ``LINKESCAPE_AUTH_KEY`` (the secret itself) or ``LINKESCAPE_AUTH_KEY_FILE``
  (a file holding it; surrounding whitespace is stripped, so ``echo $KEY >
  file`` works): every rank of a job gets the same one from its launcher.
- Without either, rank 0 creates a random per-job secret and publishes it in
  the store next to ``linkescape/job``. Links then still keep out strangers
  who cannot read the store, but not those who can; rank 0 says so once.
"""

from __future__ import annotations

import logging
import os
import secrets
import stat
from typing import Optional, Tuple

from .config import Config
from .errors import ConfigError

log = logging.getLogger("linkescape.auth")

KEY_SECRET = "linkescape/secret"


def load_key(config: Config) -> Optional[bytes]:
    """The configured key, or None when the job has none. ConfigError for an
    unreadable or empty key file."""
    if config.auth_key is not None:
        key = config.auth_key.encode()
        if not key.strip():
            raise ConfigError("LINKESCAPE_AUTH_KEY is blank")
        return key
    path = config.auth_key_file
    if path is None:
        return None
    try:
        with open(os.path.expanduser(path), "rb") as f:
            mode = os.fstat(f.fileno()).st_mode
            key = f.read(1 << 16).strip()
    except OSError as exc:
        raise ConfigError(f"LINKESCAPE_AUTH_KEY_FILE={path!r} cannot be read: {exc}") from None
    if not key:
        raise ConfigError(f"LINKESCAPE_AUTH_KEY_FILE={path!r} holds no key")
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        log.warning("LINKESCAPE_AUTH_KEY_FILE=%s is readable by other users (mode %o)", path, mode & 0o777)
    return key


def new_job_secret() -> str:
    """What rank 0 publishes under ``linkescape/secret`` (256 random bits)."""
    return secrets.token_hex(32)


def link_key(config: Config, store_secret: Optional[bytes], rank: int) -> Tuple[bytes, str]:
    """The HMAC key of this job's link handshakes and where it came from
    (``"key"`` or ``"store"``)."""
    key = load_key(config)
    if key is not None:
        if len(key) < 16:
            log.warning("the link key is %d bytes long: an observer of one handshake could guess it offline; "
                        "use at least 16 random bytes", len(key))
        if rank == 0:
            log.info("links authenticated with the key from %s",
                     "LINKESCAPE_AUTH_KEY" if config.auth_key is not None else config.auth_key_file)
        return key, "key"
    if not store_secret:
        raise ConfigError("no LINKESCAPE_AUTH_KEY and no per-job secret in the store")
    if rank == 0:
        log.warning("no LINKESCAPE_AUTH_KEY: links are authenticated with a per-job secret from the store, which "
                    "protects only against strangers who cannot read the store")
    return bytes(store_secret), "store"


__all__ = ["KEY_SECRET", "load_key", "new_job_secret", "link_key"]
