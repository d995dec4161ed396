"""The descriptors the engine waits on: links, a wake-up pipe, and others'
(the carrier monitor). Two epoll sets: the one a driving thread waits on
(every link), and the background thread's idle one (no links: while a
caller drives an operation, a frame must wake exactly one thread)."""

from __future__ import annotations

import os
import select
from typing import Callable, Dict, List, Tuple

from .link import Link

POLLIN = select.POLLIN
POLLOUT = select.POLLOUT
POLLERR = select.POLLERR | select.POLLHUP | select.POLLNVAL
#: the longest a poll waits (seconds): nothing is due, but a wake-up costs nothing then
MAX_WAIT = 60.0


def _unregister(poller, fd: int) -> None:
    try:
        poller.unregister(fd)
    except (KeyError, ValueError, OSError):
        pass


class Signal:
    """A wake-up another thread can wait on with poll (a pipe)."""

    def __init__(self) -> None:
        self._r, self._w = os.pipe()
        os.set_blocking(self._r, False)
        os.set_blocking(self._w, False)

    def fileno(self) -> int:
        return self._r

    def set(self) -> None:
        try:
            os.write(self._w, b"x")
        except OSError:
            pass

    def clear(self) -> None:
        try:
            os.read(self._r, 4096)
        except OSError:
            pass

    def close(self) -> None:
        for fd in (self._r, self._w):
            try:
                os.close(fd)
            except OSError:
                pass


class IoSet:
    """epoll, not poll: a wait costs what is ready, not every registered link
    (a rank of N ranks holds about N x rails of them)."""

    def __init__(self) -> None:
        self.poller = select.epoll()
        self.idle_poller = select.epoll()
        self.links: Dict[int, Link] = {}
        self.masks: Dict[int, int] = {}
        self.extra: Dict[int, Callable[[int], None]] = {}
        #: polls that returned (an idle rank's wake-ups; the idle-cost tests count them)
        self.wakeups = 0
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self.poller.register(self._wake_r, POLLIN)
        self.idle_poller.register(self._wake_r, POLLIN)

    # ------------------------------------------------------------ links
    def add_link(self, link: Link) -> None:
        self.links[link.fd] = link
        self.masks[link.fd] = POLLIN
        self.poller.register(link.fd, POLLIN)

    def remove_link(self, link: Link) -> None:
        if self.links.get(link.fd) is link:
            _unregister(self.poller, link.fd)
            del self.links[link.fd]
            self.masks.pop(link.fd, None)

    def want(self, link: Link, mask: int) -> None:
        if self.masks.get(link.fd) != mask and self.links.get(link.fd) is link:
            self.masks[link.fd] = mask
            self.poller.modify(link.fd, mask)

    def want_out(self, link: Link, out: bool) -> None:
        """Wait for room to write on ``link`` (or stop), its read interest as it is."""
        mask = self.masks.get(link.fd)
        if mask is not None:
            self.want(link, (mask & ~POLLOUT) | (POLLOUT if out else 0))

    # ------------------------------------------------------------ other descriptors
    def add_fd(self, fd: int, handler: Callable[[int], None]) -> None:
        self.extra[fd] = handler
        self.poller.register(fd, POLLIN)
        self.idle_poller.register(fd, POLLIN)

    def remove_fd(self, fd: int) -> None:
        self.extra.pop(fd, None)  # (a poll running in another thread may still report it: looked up with get)
        _unregister(self.poller, fd)
        _unregister(self.idle_poller, fd)

    # ------------------------------------------------------------ waiting
    def poll(self, timeout: float) -> List[Tuple[int, int]]:
        self.wakeups += 1
        try:
            return self.poller.poll(min(max(0.0, timeout), MAX_WAIT))
        except InterruptedError:
            return []

    def idle_poll(self, timeout: float) -> List[Tuple[int, int]]:
        self.wakeups += 1
        try:
            return self.idle_poller.poll(min(max(0.0, timeout), MAX_WAIT))
        except (InterruptedError, RuntimeError, ValueError):
            return []

    def is_wake(self, fd: int) -> bool:
        return fd == self._wake_r

    def drain_wake(self) -> None:
        try:
            os.read(self._wake_r, 4096)
        except OSError:
            pass

    def wake(self) -> None:
        try:
            os.write(self._wake_w, b"x")
        except (BlockingIOError, OSError):
            pass

    def close(self) -> None:
        for fd in (self._wake_r, self._wake_w):
            try:
                os.close(fd)
            except OSError:
                pass
        self.poller.close()
        self.idle_poller.close()
