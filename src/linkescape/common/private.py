"""Private files and directories: what the library and its root-run tools
create on disk (run directories, event logs, debug logs, flight-recorder
dumps, the demo's and chaos tool's reports).

Rules (issue 48: a local user must not make root write through a link):
- A directory we create is 0700 (whatever the umask). A directory that
  exists already is used only if it is a real directory (not a symlink),
  owned by us (or root), and not writable by group or others; otherwise a
  ``ConfigError`` names it and the fix. OpenSSH's StrictModes refuses the same.
- A file is opened with ``O_NOFOLLOW`` (a planted symlink is an error, never
  followed) and created 0600; a new file is created with ``O_EXCL`` (a name
  planted before is an error, never truncated). A file that exists already
  is appended to only if it is a regular file we own.
- A name in a directory others may write (``/tmp``) is never predictable:
  ``mkdtemp`` or a random suffix.
"""

from __future__ import annotations

import errno
import os
import stat
import tempfile
from typing import Optional

from .errors import ConfigError

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)


def _owner_ok(uid: int) -> bool:
    return uid in (os.geteuid(), 0)


def check_private_dir(path: str) -> None:
    """``path`` is a directory only we may write: a real directory (not a
    symlink), ours, no write bit for group or others. ``ConfigError`` if not."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such directory") from None
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise ConfigError(f"{path} is not a directory (a symlink or a file): refused; remove it or choose another")
    if not _owner_ok(st.st_uid):
        raise ConfigError(f"{path} belongs to uid {st.st_uid}, not to us: refused (another user could plant "
                          f"files in it); choose a directory of our own")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise ConfigError(f"{path} is writable by group or others (mode {st.st_mode & 0o7777:04o}): refused; "
                          f"run: chmod go-w {path}")


def private_dir(path: Optional[str] = None, prefix: str = "linkescape-") -> str:
    """Make ``path`` 0700 (its missing parents too), or check a directory
    that exists (``check_private_dir``). Without ``path``: a fresh directory
    with an unpredictable name under the temporary directory."""
    if path is None:
        return tempfile.mkdtemp(prefix=prefix)  # 0700, a random name, created exclusively
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        os.makedirs(parent, 0o700, exist_ok=True)
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        check_private_dir(path)
    else:
        os.chmod(path, 0o700)  # whatever the umask
    return path


def open_private(path: str, mode: str = "x") -> int:
    """A file descriptor to write ``path``: never through a symlink, 0600.
    ``mode`` "x": create a new file exclusively (``FileExistsError`` when the
    name is taken); "a": create it or append to our own regular file; "w":
    the same, truncated (for a name in a private directory)."""
    if mode not in ("x", "a", "w"):
        raise ValueError(f"mode {mode!r}: x, a or w")
    extra = {"x": os.O_EXCL, "a": os.O_APPEND, "w": os.O_TRUNC}[mode]
    # O_NONBLOCK: a planted FIFO must not block the open (no reader: ENXIO; a reader: fstat refuses it)
    flags = os.O_WRONLY | os.O_CREAT | _NOFOLLOW | _CLOEXEC | _NONBLOCK | extra
    if mode == "w":  # check before truncating: never truncate what is not ours
        flags &= ~os.O_TRUNC
    try:
        fd = os.open(path, flags, 0o600)
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # O_NOFOLLOW met a symlink
            raise ConfigError(f"{path} is a symlink: refused (never written through)") from None
        if exc.errno == errno.ENXIO:  # a FIFO (or a socket) without a reader
            raise ConfigError(f"{path} is not a regular file of ours (or has other hard links): refused") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or not _owner_ok(st.st_uid) or st.st_nlink != 1:
            raise ConfigError(f"{path} is not a regular file of ours (or has other hard links): refused")
        if _NONBLOCK:
            os.set_blocking(fd, True)
        if st.st_mode & 0o077:
            os.fchmod(fd, 0o600)
        if mode == "w":
            os.ftruncate(fd, 0)
    except BaseException:
        os.close(fd)
        raise
    return fd


def write_private(path: str, data, replace: bool = True) -> None:
    """Write ``data`` (str or bytes) to ``path``, 0600: into a new temporary
    file with a random name beside it, renamed over ``path`` (``replace``),
    so that neither a planted file nor a planted symlink is ever written."""
    raw = data.encode() if isinstance(data, str) else bytes(data)
    d = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=".tmp", dir=d)  # 0600, O_EXCL
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
        if replace:
            os.replace(tmp, path)
        else:
            os.link(tmp, path)  # fails when the name exists
            os.unlink(tmp)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def open_private_file(path: str, mode: str = "w", encoding: Optional[str] = "utf-8"):
    """``open()``'s file object for ``open_private``: ``mode`` one of x, w, a
    (with b for bytes)."""
    fd = open_private(path, mode.replace("b", "")[:1])
    if "b" in mode:
        return os.fdopen(fd, mode.replace("x", "w"))
    return os.fdopen(fd, mode.replace("x", "w"), encoding=encoding)


#: variables whose value is a secret: a report says they were set, never what they hold
SECRET_VARS = frozenset(("LINKESCAPE_AUTH_KEY",))


def redact_env(env) -> dict:
    """``env`` with every secret's value replaced (issue 48: nothing secret in
    a report or a log). A name with KEY, SECRET, TOKEN or PASSWORD in it counts
    as a secret (a key file's path does not: ``..._KEY_FILE``)."""
    def secret(name: str) -> bool:
        up = name.upper()
        return name in SECRET_VARS or (not up.endswith("_FILE") and any(
            w in up for w in ("KEY", "SECRET", "TOKEN", "PASSWORD")))
    return {k: ("<redacted>" if secret(k) else v) for k, v in dict(env).items()}


__all__ = ["redact_env", "SECRET_VARS", "check_private_dir", "private_dir", "open_private", "open_private_file", "write_private"]
