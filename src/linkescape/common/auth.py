"""The key that authenticates a job's links.

- ``LINKESCAPE_AUTH_KEY`` (the secret itself) or ``LINKESCAPE_AUTH_KEY_FILE``
  (a file holding it): every rank of a job gets the same one from its
  launcher. Both are stripped of surrounding whitespace the same way (so
  ``echo $KEY > file`` works), and an empty or blank key from either is a
  ``ConfigError``, never "no key" (``LINKESCAPE_AUTH_KEY=$(cat missing)``).
- A key file must be the user's own and closed to group and others, as ssh
  wants of a private key: otherwise ``ConfigError`` with the fix
  (``chmod 600 FILE``).
- Without either, rank 0 creates a random per-job secret and publishes it in
  the store next to ``linkescape/job``. Links then still keep out strangers
  who cannot read the store, but not those who can; rank 0 says so once.
  ``LINKESCAPE_AUTH=required`` refuses that: no key, no start.
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


#: the largest key file read (a key is a few dozen bytes)
MAX_KEY_FILE = 1 << 16


def load_key(config: Config) -> Optional[bytes]:
    """The configured key, stripped of surrounding whitespace whichever
    variable gave it, or None when the job has none. ConfigError for an
    empty or blank key, an unreadable key file, or a key file that another
    user owns or that group or others may access; and, with
    ``LINKESCAPE_AUTH=required``, for no key at all."""
    if config.auth_key is not None:
        key = config.auth_key.encode().strip()
        if not key:
            raise ConfigError("LINKESCAPE_AUTH_KEY is set but empty or blank: give it the job's key, or unset it")
        return key
    path = config.auth_key_file
    if path is None:
        if getattr(config, "auth", "optional") == "required":
            raise ConfigError("LINKESCAPE_AUTH=required, but no key is set: give every rank the same key with "
                              "LINKESCAPE_AUTH_KEY_FILE=FILE (mode 0600) or LINKESCAPE_AUTH_KEY")
        return None
    if not path.strip():
        raise ConfigError("LINKESCAPE_AUTH_KEY_FILE is set but empty: name the key file, or unset it")
    full = os.path.expanduser(path)
    try:
        with open(full, "rb") as f:
            st = os.fstat(f.fileno())  # the file read, not a name that may change under us
            _check_key_file(path, st)
            key = f.read(MAX_KEY_FILE + 1).strip()
    except OSError as exc:
        raise ConfigError(f"LINKESCAPE_AUTH_KEY_FILE={path!r} cannot be read: {exc}") from None
    if not key:
        raise ConfigError(f"LINKESCAPE_AUTH_KEY_FILE={path!r} holds no key (it is empty or blank)")
    if len(key) > MAX_KEY_FILE:
        raise ConfigError(f"LINKESCAPE_AUTH_KEY_FILE={path!r} is larger than {MAX_KEY_FILE} bytes: not a key")
    return key


def _check_key_file(path: str, st: os.stat_result) -> None:
    """Refuse a key file that is not a regular file of this user's, closed to
    group and others (what ssh asks of a private key)."""
    if not stat.S_ISREG(st.st_mode):
        raise ConfigError(f"LINKESCAPE_AUTH_KEY_FILE={path!r} is not a regular file")
    uid = os.geteuid()
    if st.st_uid != uid:
        raise ConfigError(f"LINKESCAPE_AUTH_KEY_FILE={path!r} is owned by uid {st.st_uid}, not by this user "
                          f"(uid {uid}): another user could change the key. Give the rank a copy of its own "
                          f"(install -m 600 {path} ~/.linkescape-key) or chown it")
    if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ConfigError(f"LINKESCAPE_AUTH_KEY_FILE={path!r} is accessible by other users (mode "
                          f"{st.st_mode & 0o777:04o}): the key must be readable by its owner only. "
                          f"Run: chmod 600 {path}")


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
