"""pytest fixtures for tests that need a real multi-host testbed.

Use them from a conftest.py (or a test module)::

    from linkescape.testbed.pytest_fixtures import testbed, testbed_factory  # noqa: F401

and mark such tests ``@pytest.mark.testbed``. Each testbed gets a random
name (``t`` + 4 hex digits), so parallel runs do not collide, and is torn down
by the fixture finalizer even when the test fails; an atexit hook catches the
rest. Without root or network-namespace support the fixtures skip the test
with the reason.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
from typing import Callable, Iterator, List, Optional

import pytest

from .netns import Testbed, make_temporary, release, unique_name


@functools.lru_cache(maxsize=None)
def testbed_unavailable() -> Optional[str]:
    """Why no testbed can be built here, or None when one can."""
    if not sys.platform.startswith("linux"):
        return "the testbed needs Linux network namespaces"
    if os.geteuid() != 0:
        return "the testbed needs root (network namespaces, veth, bridges)"
    if shutil.which("ip") is None:
        return "the testbed needs iproute2 ('ip')"
    # Really try: containers often have root without CAP_SYS_ADMIN/NET_ADMIN.
    probe = unique_name("lp")
    try:
        steps = [["ip", "netns", "add", probe],
                 ["ip", "link", "add", f"{probe}-a", "type", "veth", "peer", "name", "p0", "netns", probe]]
        for argv in steps:
            proc = subprocess.run(argv, capture_output=True, text=True)
            if proc.returncode != 0:
                return f"cannot create testbed objects ({' '.join(argv[:3])}): {proc.stderr.strip()}"
        return None
    finally:
        subprocess.run(["ip", "link", "del", f"{probe}-a"], capture_output=True)
        subprocess.run(["ip", "netns", "del", probe], capture_output=True)


def require_testbed() -> None:
    """Skip the calling test unless a testbed can be built."""
    reason = testbed_unavailable()
    if reason:
        pytest.skip(reason)


def require_nft() -> None:
    """Skip the calling test unless nftables is installed (blackhole faults)."""
    if shutil.which("nft") is None:
        pytest.skip("blackhole faults need nftables (apt-get install -y nftables)")


@pytest.fixture
def testbed_factory() -> Iterator[Callable[..., Testbed]]:
    """``testbed_factory(hosts=2, rails=2, rate=None) -> Testbed``; all removed after the test."""
    require_testbed()
    made: List[Testbed] = []

    def factory(hosts: int = 2, rails: int = 2, rate: Optional[str] = None) -> Testbed:
        tb = make_temporary(hosts, rails, rate=rate)
        made.append(tb)
        return tb

    try:
        yield factory
    finally:
        errors = []
        for tb in made:
            try:
                release(tb)
            except Exception as exc:  # keep tearing down the others
                errors.append(exc)
        if errors:
            raise errors[0]


@pytest.fixture
def testbed(testbed_factory: Callable[..., Testbed]) -> Testbed:
    """A 2-host, 2-rail unshaped testbed."""
    return testbed_factory(2, 2)


__all__ = ["testbed", "testbed_factory", "require_testbed", "require_nft", "testbed_unavailable"]
