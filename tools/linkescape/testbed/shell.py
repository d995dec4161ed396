"""The testbed's plumbing: its errors and the helper commands (``ip``, ``nft``) it runs.

The lowest floor of the testbed package: :mod:`.nft`, :mod:`.netns` and
:mod:`.faults` all build on it, and it imports none of them.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from typing import Any, Dict, List, Optional, Sequence

from ..common.errors import LinkEscapeError

NETNS_DIR = "/run/netns"


class TestbedError(LinkEscapeError):
    """The testbed could not be built, found, changed or torn down."""

    __test__ = False  # not a pytest test class despite the name


class TestbedExists(TestbedError):
    """A testbed (or leftovers of one) with this name already exists."""

    __test__ = False


class BadRate(TestbedError, ValueError):
    """A rail rate that is not a tc rate (``1gbit``, ``100mbit``, ``125mbps``)."""


def require_root(what: str = "the testbed") -> None:
    """Raise :class:`TestbedError` unless we may create namespaces and links."""
    if os.geteuid() != 0:
        raise TestbedError(f"{what} needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN); run it with sudo")
    if shutil.which("ip") is None:
        raise TestbedError("the 'ip' command (iproute2) is not installed")


def require_nft() -> str:
    path = shutil.which("nft")
    if path is None:
        raise TestbedError("blackhole and lossy faults need nftables: apt-get install -y nftables")
    return path


def run(argv: Sequence[str], *, input: Optional[str] = None, check: bool = True,
        what: Optional[str] = None) -> subprocess.CompletedProcess:
    """Run a helper command, capturing output; raise TestbedError on failure."""
    try:
        proc = subprocess.run(list(argv), input=input, capture_output=True, text=True)
    except FileNotFoundError as exc:
        raise TestbedError(f"{argv[0]} is not installed: {exc}") from None
    if check and proc.returncode != 0:
        detail = (proc.stderr or proc.stdout).strip()
        raise TestbedError(f"{what or ' '.join(argv)} failed (exit {proc.returncode}): {detail}")
    return proc


def ip_batch(lines: Sequence[str], netns: Optional[str] = None, what: str = "ip -batch") -> None:
    """Run many ``ip`` commands in one process (much faster than one each)."""
    if not lines:
        return
    argv = ["ip"] + (["-n", netns] if netns else []) + ["-batch", "-"]
    run(argv, input="\n".join(lines) + "\n", what=what)


def links(netns: Optional[str] = None) -> Dict[str, Dict[str, Any]]:
    """Map interface name -> ``ip -j link`` record, in the root or a namespace."""
    argv = ["ip"] + (["-n", netns] if netns else []) + ["-j", "link", "show"]
    proc = run(argv, check=False)
    if proc.returncode != 0 or not proc.stdout.strip():
        return {}
    return {rec["ifname"]: rec for rec in json.loads(proc.stdout)}


def list_netns() -> List[str]:
    """Names of all named network namespaces (``ip netns list``)."""
    try:
        return sorted(os.listdir(NETNS_DIR))
    except FileNotFoundError:
        return []


def in_netns(netns: Optional[str], argv: Sequence[str]) -> List[str]:
    """``argv`` prefixed so that it runs inside ``netns`` (None: the root namespace)."""
    return ["ip", "netns", "exec", netns, *argv] if netns else list(argv)


__all__ = ["TestbedError", "TestbedExists", "BadRate", "require_root", "require_nft", "run", "ip_batch", "links",
           "list_netns", "in_netns", "NETNS_DIR"]
