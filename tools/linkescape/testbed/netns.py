"""A multi-host, multi-rail testbed built from Linux network namespaces.

Layout of a testbed called ``PREFIX`` with N hosts and R rails::

    host i      = network namespace  PREFIX-h{i}
    rail r      = Linux bridge       PREFIX-b{r}        (root namespace)
    NIC r{r}    = veth inside host i, peer PREFIX-{i}s{r} on bridge PREFIX-b{r}
                  address 198.18.{r}.{i+1}/24
    NIC mgmt    = veth inside host i, peer PREFIX-{i}sm on bridge PREFIX-bm
                  address 198.19.0.{i+1}/24  (front-end network: rendezvous store)

Bridges only switch: nothing is routed, IP forwarding is never touched, and
addresses exist only inside the testbed's namespaces. The layout is recorded
in ``/run/linkescape/testbed-PREFIX.json``; every object is also found by its
name, so :func:`down` works after a crash without the state file.

This module builds, inspects and removes testbeds; it knows nothing of faults.
Faults (cut, blackhole, lossy, flap, restore) live in
:mod:`linkescape.testbed.faults`, which needs a testbed; it also gives
:class:`Testbed` its fault methods (``tb.cut(i, r)`` ...) when it is imported,
and importing :mod:`linkescape.testbed` always imports it.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import json
import os
import re
import secrets
import signal
import subprocess
import time
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Union

from . import nft
from .shell import (NETNS_DIR, BadRate, TestbedError, TestbedExists, ip_batch as _ip_batch, links as _links,
                    list_netns, require_nft, require_root, run as _run)

DEFAULT_NAME = "le"
STATE_DIR_ENV = "LINKESCAPE_TESTBED_STATE_DIR"
DEFAULT_STATE_DIR = "/run/linkescape"
IFNAMSIZ = 15  # longest interface name the kernel accepts

_NAME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9]*$")
_RATE_RE = re.compile(r"^[0-9]+(\.[0-9]+)?[A-Za-z]*$")  # tc parses the unit; no spaces or newlines


_RATE_UNITS = {"bit": 1.0, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12, "bps": 8.0, "kbps": 8e3,
               "mbps": 8e6, "gbps": 8e9, "tbps": 8e12, "kibit": 1024.0, "mibit": 1024.0 ** 2, "gibit": 1024.0 ** 3}


def rate_bps(rate: str) -> float:
    """A tc rate (``1gbit``, ``100mbit``, ``125mbps``) in bits per second."""
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*", rate or "")
    unit = m.group(2).lower() or "bit" if m else None
    if not m or unit not in _RATE_UNITS:
        raise BadRate(f"rate {rate!r}: expected a tc rate such as 100mbit or 1gbit")
    return float(m.group(1)) * _RATE_UNITS[unit]


def _write_sysctl(path: str, value: str) -> None:
    try:
        with open(path, "w") as f:
            f.write(value)
    except OSError:
        pass  # best effort: only used to silence IPv6 chatter


def _patterns(name: str) -> Dict[str, "re.Pattern[str]"]:
    p = re.escape(name)
    return {
        "netns": re.compile(rf"^{p}-h(\d+)$"),
        "bridge": re.compile(rf"^{p}-b(\d+|m)$"),
        "veth": re.compile(rf"^{p}-(\d+)s(\d+|m)$"),
    }


def validate_name(name: str) -> str:
    if not _NAME_RE.fullmatch(name or ""):
        raise TestbedError(f"testbed name {name!r} must be a letter followed by letters/digits")
    return name


def state_path(name: str) -> str:
    return os.path.join(os.environ.get(STATE_DIR_ENV, DEFAULT_STATE_DIR), f"testbed-{name}.json")


# ---------------------------------------------------------------- link state
@dataclass(frozen=True)
class LinkState:
    """What one rail NIC of one host looks like right now."""

    host: int
    rail: Union[int, str]
    nic: str
    admin_up: bool  # the host's NIC is administratively up
    carrier: bool  # LOWER_UP inside the host (False after a cut)
    operstate: str
    cut: bool  # the bridge-side veth is administratively down
    blackholed: bool  # an nftables drop table is installed for this rail
    lossy: Optional[float] = None  # percent of packets dropped at random (None: not lossy)

    @property
    def usable(self) -> bool:
        """True when traffic can flow on this NIC."""
        return self.admin_up and self.carrier and not self.blackholed

    @property
    def degraded(self) -> bool:
        """Usable, but packets are dropped at random (a lossy fault)."""
        return self.usable and self.lossy is not None

    def to_dict(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)


def _flags_state(rec: Optional[Mapping[str, Any]]) -> Dict[str, Any]:
    if not rec:
        return {"admin_up": False, "carrier": False, "operstate": "ABSENT"}
    flags = rec.get("flags", [])
    return {"admin_up": "UP" in flags, "carrier": "LOWER_UP" in flags,
            "operstate": rec.get("operstate", "UNKNOWN")}


# --------------------------------------------------------------------- Testbed
@dataclass
class Testbed:
    """Handle on a testbed; build one with :meth:`up`, find one with :meth:`attach`.

    ``with Testbed.up(2, 2) as tb:`` tears the testbed down on exit.
    """

    __test__ = False  # keep pytest from collecting this class

    name: str
    hosts: int
    rails: int
    rate: Optional[str] = None

    # ------------------------------------------------------------ naming
    def netns(self, i: int) -> str:
        """Namespace name of host ``i``."""
        self._check_host(i)
        return f"{self.name}-h{i}"

    @staticmethod
    def nic(rail: Union[int, str]) -> str:
        """NIC name of a rail inside a host: ``r0``, ``r1`` ... or ``mgmt``."""
        return "mgmt" if rail == "mgmt" else f"r{int(rail)}"

    @property
    def rail_nics(self) -> List[str]:
        return [self.nic(r) for r in range(self.rails)]

    def bridge(self, rail: Union[int, str]) -> str:
        return f"{self.name}-bm" if rail == "mgmt" else f"{self.name}-b{self._check_rail(rail)}"

    def root_veth(self, i: int, rail: Union[int, str]) -> str:
        """Bridge-side (root namespace) end of host ``i``'s NIC on ``rail``."""
        self._check_host(i)
        suffix = "m" if rail == "mgmt" else str(self._check_rail(rail))
        return f"{self.name}-{i}s{suffix}"

    def host_addr(self, i: int, rail: int) -> str:
        """IPv4 address of host ``i`` on ``rail``: 198.18.rail.(i+1)."""
        self._check_host(i)
        return f"198.18.{self._check_rail(rail)}.{i + 1}"

    def mgmt_addr(self, i: int) -> str:
        """IPv4 address of host ``i`` on the management network: 198.19.0.(i+1)."""
        self._check_host(i)
        return f"198.19.0.{i + 1}"

    def addr(self, i: int, rail: Union[int, str]) -> str:
        return self.mgmt_addr(i) if rail == "mgmt" else self.host_addr(i, int(rail))

    @property
    def state_file(self) -> str:
        return state_path(self.name)

    def _check_host(self, i: int) -> int:
        if not 0 <= int(i) < self.hosts:
            raise TestbedError(f"host {i} is not in [0, {self.hosts}) of testbed {self.name!r}")
        return int(i)

    def _check_rail(self, r: Union[int, str]) -> int:
        try:
            ok = 0 <= int(r) < self.rails
        except (TypeError, ValueError):
            ok = False
        if not ok:
            raise TestbedError(f"rail {r} is not in [0, {self.rails}) of testbed {self.name!r}")
        return int(r)

    # ------------------------------------------------------------ lifecycle
    @classmethod
    def up(cls, hosts: int, rails: int, rate: Optional[str] = None, name: Optional[str] = None,
           *, replace: bool = False) -> "Testbed":
        """Build a testbed: ``hosts`` namespaces, ``rails`` bridges and a mgmt bridge.

        ``rate`` (a tc rate such as ``"1gbit"``) shapes every rail NIC's egress
        with tbf. With ``replace`` an existing testbed of that name is torn
        down first; otherwise :class:`TestbedExists` is raised. A failure half
        way removes whatever was created.
        """
        require_root()
        name = validate_name(name or DEFAULT_NAME)
        if not 1 <= hosts <= 254:
            raise TestbedError(f"--hosts {hosts}: need 1..254 hosts (198.18.r.1-254)")
        if not 1 <= rails <= 256:
            raise TestbedError(f"--rails {rails}: need 1..256 rails (198.18.0-255.x)")
        if rate is not None and not _RATE_RE.fullmatch(rate):
            raise TestbedError(f"--rate {rate!r}: expected a tc rate such as 100mbit or 1gbit")
        tb = cls(name=name, hosts=hosts, rails=rails, rate=rate)
        longest = max(len(tb.root_veth(hosts - 1, rails - 1)), len(tb.bridge(rails - 1)))
        if longest > IFNAMSIZ:
            raise TestbedError(f"testbed name {name!r} too long: interface names would have {longest} "
                               f"characters (max {IFNAMSIZ})")
        leftovers = find_leftovers(name)
        leftovers.pop("state", None)  # a state file alone is stale; _save overwrites it
        if leftovers:
            if not replace:
                raise TestbedExists(f"testbed {name!r} already exists; run "
                                    f"'linkescape testbed down --name {name}' first")
            down(name)
        try:
            tb._create()
        except TestbedExists:
            raise  # lost a race for the name: _create removed its own part, the rest is not ours
        except BaseException:
            down(name)
            raise
        return tb

    def _create(self) -> None:
        # Namespaces first; `ip netns add` fails if the name is taken, which is
        # how two parallel creators with the same prefix notice each other.
        for i in range(self.hosts):
            proc = _run(["ip", "netns", "add", self.netns(i)], check=False)
            if proc.returncode != 0:
                if "exists" in proc.stderr:
                    for j in range(i):
                        _run(["ip", "netns", "del", self.netns(j)], check=False)
                    raise TestbedExists(f"namespace {self.netns(i)} already exists")
                raise TestbedError(f"ip netns add {self.netns(i)}: {proc.stderr.strip()}")
            # No IPv6 inside hosts: only 198.18/15 is used, and router/neighbour
            # solicitations would muddy packet counters in fault tests.
            _run(["ip", "netns", "exec", self.netns(i), "sysctl", "-qw",
                  "net.ipv6.conf.all.disable_ipv6=1", "net.ipv6.conf.default.disable_ipv6=1"],
                 check=False)

        rails: List[Union[int, str]] = list(range(self.rails)) + ["mgmt"]
        root: List[str] = []
        for r in rails:
            # STP off: ports forward at once; no multicast snooping surprises.
            root.append(f"link add {self.bridge(r)} type bridge stp_state 0 forward_delay 0 "
                        f"mcast_snooping 0")
        for i in range(self.hosts):
            for r in rails:
                root.append(f"link add {self.root_veth(i, r)} type veth peer name {self.nic(r)} "
                            f"netns {self.netns(i)}")
        _ip_batch(root, what="creating bridges and veths")
        for dev in [self.bridge(r) for r in rails] + [self.root_veth(i, r) for i in range(self.hosts)
                                                      for r in rails]:
            _write_sysctl(f"/proc/sys/net/ipv6/conf/{dev}/disable_ipv6", "1")
        links = [f"link set {self.bridge(r)} up" for r in rails]
        links += [f"link set {self.root_veth(i, r)} master {self.bridge(r)} up"
                  for i in range(self.hosts) for r in rails]
        _ip_batch(links, what="attaching veths to bridges")

        for i in range(self.hosts):
            ns = self.netns(i)
            cmds = ["link set lo up"]
            for r in rails:
                cmds.append(f"addr add {self.addr(i, r)}/24 dev {self.nic(r)}")
                cmds.append(f"link set {self.nic(r)} up")
            _ip_batch(cmds, netns=ns, what=f"configuring {ns}")
            if self.rate:
                tc = [f"qdisc add dev {self.nic(r)} root tbf rate {self.rate} burst 256k latency 10ms"
                      for r in range(self.rails)]
                _run(["tc", "-n", ns, "-batch", "-"], input="\n".join(tc) + "\n",
                     what=f"shaping {ns} rails to {self.rate}")
        self._wait_carrier(timeout=5.0)
        self._save()

    def _wait_carrier(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            missing = []
            for i in range(self.hosts):
                links = _links(self.netns(i))
                missing += [f"{self.netns(i)}:{nic}" for nic in self.rail_nics + ["mgmt"]
                            if not _flags_state(links.get(nic))["carrier"]]
            if not missing:
                return
            if time.monotonic() > deadline:
                raise TestbedError(f"no carrier on {', '.join(missing)} after {timeout}s")
            time.sleep(0.02)

    def _save(self) -> None:
        path = self.state_file
        os.makedirs(os.path.dirname(path), exist_ok=True)
        state = {
            "name": self.name, "hosts": self.hosts, "rails": self.rails, "rate": self.rate,
            "created": time.time(), "creator_pid": os.getpid(),
            "netns": [self.netns(i) for i in range(self.hosts)],
            "bridges": [self.bridge(r) for r in range(self.rails)] + [self.bridge("mgmt")],
            "nics": self.rail_nics + ["mgmt"],
            "addresses": {self.netns(i): {**{self.nic(r): self.host_addr(i, r) for r in range(self.rails)},
                                          "mgmt": self.mgmt_addr(i)} for i in range(self.hosts)},
        }
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(state, f, indent=2)
        os.replace(tmp, path)

    @classmethod
    def attach(cls, name: Optional[str] = None) -> "Testbed":
        """Find an existing testbed: from its state file, else from its objects."""
        name = validate_name(name or DEFAULT_NAME)
        try:
            with open(state_path(name)) as f:
                st = json.load(f)
            tb = cls(name=name, hosts=int(st["hosts"]), rails=int(st["rails"]), rate=st.get("rate"))
            if os.path.exists(os.path.join(NETNS_DIR, tb.netns(0))):
                return tb
        except (OSError, ValueError, KeyError):
            pass
        pats = _patterns(name)
        hosts = [int(m.group(1)) for n in list_netns() if (m := pats["netns"].match(n))]
        rails = [int(m.group(1)) for n in _links() if (m := pats["bridge"].match(n)) and m.group(1) != "m"]
        if not hosts or not rails:
            raise TestbedError(f"no testbed named {name!r}; create one with 'linkescape testbed up'")
        return cls(name=name, hosts=max(hosts) + 1, rails=max(rails) + 1)

    def down(self) -> Dict[str, List[str]]:
        """Tear everything down (see :func:`down`)."""
        return down(self.name)

    def __enter__(self) -> "Testbed":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.down()

    # ------------------------------------------------------------ running things
    def cmd(self, i: int, argv: Sequence[str]) -> List[str]:
        """``argv`` prefixed so that it runs inside host ``i``."""
        return ["ip", "netns", "exec", self.netns(i), *argv]

    def exec(self, i: int, argv: Sequence[str], **kwargs: Any) -> subprocess.CompletedProcess:
        """``subprocess.run`` inside host ``i``; keyword arguments pass through."""
        return subprocess.run(self.cmd(i, argv), **kwargs)

    def popen(self, i: int, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen:
        """``subprocess.Popen`` inside host ``i``; keyword arguments pass through."""
        return subprocess.Popen(self.cmd(i, argv), **kwargs)

    # ------------------------------------------------------------ state
    def link_state(self, i: int, rail: Union[int, str]) -> LinkState:
        """Carrier, admin state, cut, blackhole and lossy status of one host NIC."""
        nic = self.nic(rail)
        inside = _flags_state(_links(self.netns(i)).get(nic))
        outside = _flags_state(_links().get(self.root_veth(i, rail)))
        found = nft.tables(self.netns(i))
        return LinkState(host=i, rail=rail, nic=nic, cut=not outside["admin_up"],
                         blackholed=nic in nft.blackholed_nics(self.netns(i), found),
                         lossy=nft.lossy_nics(self.netns(i), found).get(nic), **inside)

    def status(self) -> Dict[str, Any]:
        """Everything about the testbed in one JSON-able dict."""
        root = _links()
        hosts = []
        for i in range(self.hosts):
            ns = self.netns(i)
            inside = _links(ns)
            found = nft.tables(ns)
            bh = nft.blackholed_nics(ns, found)
            loss = nft.lossy_nics(ns, found)
            nics = []
            for r in list(range(self.rails)) + ["mgmt"]:
                nic = self.nic(r)
                st = _flags_state(inside.get(nic))
                nics.append({"nic": nic, "addr": self.addr(i, r), **st,
                             "cut": not _flags_state(root.get(self.root_veth(i, r)))["admin_up"],
                             "blackholed": nic in bh, "lossy": loss.get(nic)})
            hosts.append({"host": i, "netns": ns, "present": ns in list_netns(), "nics": nics})
        return {"name": self.name, "hosts": self.hosts, "rails": self.rails, "rate": self.rate,
                "bridges": {self.bridge(r): _flags_state(root.get(self.bridge(r)))["admin_up"]
                            for r in list(range(self.rails)) + ["mgmt"]},
                "host_status": hosts}


# ------------------------------------------------------------------ teardown
def find_leftovers(name: str) -> Dict[str, List[str]]:
    """Every kernel object and file that belongs to testbed ``name``."""
    pats = _patterns(name)
    links = _links()
    found = {
        "netns": [n for n in list_netns() if pats["netns"].match(n)],
        "veths": [n for n in links if pats["veth"].match(n)],
        "bridges": [n for n in links if pats["bridge"].match(n)],
        "state": [state_path(name)] if os.path.exists(state_path(name)) else [],
    }
    return {k: v for k, v in found.items() if v}


def _kill_netns_processes(namespaces: Sequence[str], grace: float = 1.0) -> List[int]:
    """Stop whatever still runs inside the testbed's namespaces (they are ours)."""
    pids: List[int] = []
    for ns in namespaces:
        proc = _run(["ip", "netns", "pids", ns], check=False)
        pids += [int(p) for p in proc.stdout.split() if p.isdigit()]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        alive = [p for p in pids if _alive(p)]
        for p in alive:
            try:
                os.kill(p, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace
        while alive and time.monotonic() < deadline:
            time.sleep(0.02)
            alive = [p for p in alive if _alive(p)]
        if not alive:
            break
    return pids


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child of ours counts as gone.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def down(name: Optional[str] = None, *, kill: bool = True) -> Dict[str, List[str]]:
    """Remove every namespace, bridge, veth and fault table of testbed ``name``.

    Idempotent and independent of the state file: objects are found by name.
    With ``kill`` processes still running inside the namespaces are stopped
    first (SIGTERM, then SIGKILL), so the namespaces really go away.
    Returns what was removed.
    """
    require_root()
    name = validate_name(name or DEFAULT_NAME)
    found = find_leftovers(name)
    if kill and found.get("netns"):
        _kill_netns_processes(found["netns"])
    # Deleting the root-side veth deletes its peer at once; deleting a netns
    # only schedules its devices for asynchronous cleanup.
    cmds = [f"link del {v}" for v in found.get("veths", [])]
    cmds += [f"link del {b}" for b in found.get("bridges", [])]
    for c in cmds:  # one at a time: a concurrent down may have removed some
        _run(["ip"] + c.split(), check=False)
    for ns in found.get("netns", []):
        _run(["ip", "netns", "del", ns], check=False)
    nft.delete_root_tables(name)  # root-side tables of the ingress-only fallback
    for path in found.get("state", []):
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
    left = {k: v for k, v in find_leftovers(name).items() if k != "state"}
    if left:
        raise TestbedError(f"could not remove all of testbed {name!r}: {left}")
    return found


# ------------------------------------------------------- throwaway testbeds
_LIVE: Dict[str, int] = {}  # name -> pid that created it (forked children must not tear down)


def _down_live() -> None:
    for name, pid in list(_LIVE.items()):
        if pid == os.getpid():
            try:
                down(name)
            except Exception:  # at exit: best effort, never mask the real error
                pass
            _LIVE.pop(name, None)


atexit.register(_down_live)


def unique_name(prefix: str = "t") -> str:
    """``prefix`` + 4 random hex digits, not used by any existing testbed."""
    for _ in range(100):
        name = f"{prefix}{secrets.token_hex(2)}"
        if not find_leftovers(name):
            return name
    raise TestbedError(f"no free testbed name with prefix {prefix!r}")


def make_temporary(hosts: int = 2, rails: int = 2, rate: Optional[str] = None, prefix: str = "t") -> Testbed:
    """A testbed with a fresh random name, torn down at interpreter exit at the latest.

    Prefer :func:`temporary_testbed` (a context manager) or the pytest
    fixtures, which tear it down as soon as the user is done.
    """
    for _ in range(20):  # a parallel run may grab the same name between check and create
        name = unique_name(prefix)
        try:
            tb = Testbed.up(hosts, rails, rate=rate, name=name)
        except TestbedExists:
            continue
        _LIVE[name] = os.getpid()
        return tb
    raise TestbedError("could not find a free testbed name")


def release(tb: Testbed) -> None:
    """Tear down a testbed made by :func:`make_temporary`."""
    try:
        tb.down()
    finally:
        _LIVE.pop(tb.name, None)


@contextlib.contextmanager
def temporary_testbed(hosts: int = 2, rails: int = 2, rate: Optional[str] = None,
                      prefix: str = "t") -> Iterator[Testbed]:
    """``with temporary_testbed(2, 2) as tb:`` a uniquely named testbed, always removed."""
    tb = make_temporary(hosts, rails, rate=rate, prefix=prefix)
    try:
        yield tb
    finally:
        release(tb)


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Inside the block, SIGTERM (``kill``, a job scheduler) raises ``KeyboardInterrupt`` as Ctrl-C
    does, so the ``finally`` blocks of a tool that owns a testbed stop its ranks and take the
    namespaces, veths and bridges down (left to itself, SIGTERM ends the process with them left
    behind). Outside the main thread (an embedding caller) signals are left alone."""
    def on_term(signum, _frame):
        raise KeyboardInterrupt(f"signal {signum}")

    try:
        old = signal.signal(signal.SIGTERM, on_term)
    except ValueError:
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


__all__ = ["Testbed", "TestbedError", "TestbedExists", "LinkState", "down", "find_leftovers",
           "list_netns", "require_root", "require_nft", "state_path", "rate_bps", "DEFAULT_NAME", "unique_name", "make_temporary",
           "release", "temporary_testbed", "sigterm_as_interrupt"]
