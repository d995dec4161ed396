"""Configuration: a frozen dataclass, read from LINKESCAPE_* environment variables.

``Config.from_env()`` reads the environment once; explicit keyword arguments win
over the environment. Every value is validated here, so the layers below can
trust it.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Mapping, Optional, Tuple

from .errors import ConfigError

POLICIES = ("active-backup", "stripe")
#: LINKESCAPE_AUTH: "optional" (without a key, the per-job secret from the
#: store) or "required" (no start without LINKESCAPE_AUTH_KEY[_FILE])
AUTH_MODES = ("optional", "required")
#: LINKESCAPE_CONNECT_AT_START
CONNECT_MODES = ("auto", "all", "neighbours")
#: ``auto`` opens only the ring neighbours' links at start-up from this many ranks on
NEIGHBOURS_FROM = 16
#: variables whose empty value is a value (an error), not "unset": an empty
#: key, e.g. from ``$(cat missing)``, must never mean "no key"
_EMPTY_IS_SET = ("LINKESCAPE_AUTH_KEY", "LINKESCAPE_AUTH_KEY_FILE")


def _parse_rails(text: str) -> Tuple[str, ...]:
    rails = tuple(part.strip() for part in text.split(",") if part.strip())
    if not rails:
        raise ConfigError(f"LINKESCAPE_RAILS={text!r} names no rail")
    return rails


def _seconds(value: str, name: str) -> float:
    try:
        out = float(value)
    except ValueError:
        raise ConfigError(f"{name}={value!r} is not a number of seconds") from None
    if not out > 0:  # also refuses nan
        raise ConfigError(f"{name}={value!r} must be positive")
    return out


def _millis(value: str, name: str) -> float:
    return _seconds(value, name) / 1000.0


def _size(value: str, name: str) -> int:
    text = value.strip().upper()
    mult = 1
    for suffix, m in (("K", 1 << 10), ("M", 1 << 20), ("G", 1 << 30)):
        if text.endswith(suffix + "IB") or text.endswith(suffix + "B") or text.endswith(suffix):
            text = text[: -len(suffix + "IB")] if text.endswith(suffix + "IB") else (
                text[: -len(suffix + "B")] if text.endswith(suffix + "B") else text[:-1])
            mult = m
            break
    try:
        out = int(float(text) * mult)
    except (ValueError, OverflowError):  # OverflowError: inf
        raise ConfigError(f"{name}={value!r} is not a size") from None
    if out <= 0:
        raise ConfigError(f"{name}={value!r} must be positive")
    return out


def _millis_or_zero(value: str, name: str) -> float:
    try:
        out = float(value)
    except ValueError:
        raise ConfigError(f"{name}={value!r} is not a number of milliseconds") from None
    if not out >= 0:
        raise ConfigError(f"{name}={value!r} must be 0 (the kernel's) or more")
    return out / 1000.0


def _count(value: str, name: str) -> int:
    try:
        out = int(value)
    except ValueError:
        raise ConfigError(f"{name}={value!r} is not an integer") from None
    if out <= 0:
        raise ConfigError(f"{name}={value!r} must be positive")
    return out


def _rate(value: str, name: str) -> float:
    try:
        out = float(value)
    except ValueError:
        raise ConfigError(f"{name}={value!r} is not a number per second") from None
    if not out > 0:
        raise ConfigError(f"{name}={value!r} must be positive")
    return out


#: the largest DATA payload a frame header may announce unless configured
#: otherwise (frames carry at most ``chunk_bytes``)
DEFAULT_MAX_FRAME_BYTES = 64 << 20

def _port(value: str, name: str) -> int:
    try:
        out = int(value)
    except ValueError:
        raise ConfigError(f"{name}={value!r} is not a port number") from None
    if not 1 <= out <= 65535:
        raise ConfigError(f"{name}={value!r} must be in [1, 65535]")
    return out


def _entries(value: str, name: str) -> int:
    try:
        out = int(value)
    except ValueError:
        raise ConfigError(f"{name}={value!r} is not a number of entries") from None
    if out < 0:
        raise ConfigError(f"{name}={value!r} must be 0 (off) or more")
    return out


def _micros(value: str, name: str) -> float:
    try:
        out = float(value)
    except ValueError:
        raise ConfigError(f"{name}={value!r} is not a number of microseconds") from None
    if not out >= 0 or out == float("inf"):  # also refuses nan
        raise ConfigError(f"{name}={value!r} must be 0 (off) or more")
    return out


_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def _flag(value: str, name: str) -> bool:
    text = value.strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ConfigError(f"{name}={value!r} is not one of 1/0, true/false, yes/no, on/off")


# env var -> (field, parser)
_ENV = {
    "LINKESCAPE_RAILS": ("rails", lambda v, n: _parse_rails(v)),
    "LINKESCAPE_TIMEOUT": ("timeout", _seconds),
    "LINKESCAPE_CONNECT_TIMEOUT": ("connect_timeout", _seconds),
    "LINKESCAPE_CHUNK_BYTES": ("chunk_bytes", _size),
    "LINKESCAPE_SMALL_BYTES": ("small_bytes", _size),
    "LINKESCAPE_COPY_BYTES": ("copy_bytes", _size),
    "LINKESCAPE_DIRECT_BYTES": ("direct_bytes", _size),
    "LINKESCAPE_TREE_RANKS": ("tree_ranks", lambda v, n: _count(v, n)),
    "LINKESCAPE_TREE_RADIX": ("tree_radix", lambda v, n: _count(v, n)),
    "LINKESCAPE_HALVING_RANKS": ("halving_ranks", lambda v, n: _count(v, n)),
    "LINKESCAPE_HALVING_BYTES": ("halving_bytes", _size),
    "LINKESCAPE_POLICY": ("policy", lambda v, n: v.strip().lower()),
    "LINKESCAPE_HEARTBEAT_MS": ("heartbeat_interval", _millis),
    "LINKESCAPE_PROBE_RATE": ("probe_rate", lambda v, n: _rate(v, n)),
    "LINKESCAPE_SILENT_TIMEOUT_MS": ("silent_timeout", _millis),
    "LINKESCAPE_FAILBACK_HOLDDOWN_MS": ("failback_holddown", _millis),
    "LINKESCAPE_RECONNECT_MAX_MS": ("reconnect_max", _millis),
    "LINKESCAPE_NO_PATH_TIMEOUT": ("no_path_timeout", _seconds),
    "LINKESCAPE_PEER_LOST_TIMEOUT": ("peer_lost_timeout", _seconds),
    "LINKESCAPE_EVENTS": ("events", lambda v, n: v),
    "LINKESCAPE_METRICS_PORT": ("metrics_port", lambda v, n: _port(v, n)),
    "LINKESCAPE_METRICS_ADDR": ("metrics_addr", lambda v, n: v.strip()),
    "LINKESCAPE_TRACE_BUFFER": ("trace_buffer", lambda v, n: _entries(v, n)),
    "LINKESCAPE_TRACE_DIR": ("trace_dir", lambda v, n: v),
    "LINKESCAPE_SPIN_US": ("spin_us", _micros),
    "LINKESCAPE_YIELD_US": ("yield_us", _micros),
    "LINKESCAPE_TCP_CONGESTION": ("tcp_congestion", lambda v, n: v.strip() or None),
    "LINKESCAPE_SOCKET_BUFFER": ("socket_buffer", _size),
    "LINKESCAPE_CARRIER_WATCH": ("carrier_watch", _flag),
    "LINKESCAPE_MALLOC_TRIM": ("malloc_trim", _flag),
    "LINKESCAPE_MALLOC_THRESHOLDS": ("malloc_thresholds", _flag),
    "LINKESCAPE_AUTH_KEY": ("auth_key", lambda v, n: v),
    "LINKESCAPE_AUTH_KEY_FILE": ("auth_key_file", lambda v, n: v),
    "LINKESCAPE_AUTH": ("auth", lambda v, n: v.strip().lower()),
    "LINKESCAPE_HANDSHAKE_TIMEOUT_MS": ("handshake_timeout", _millis),
    "LINKESCAPE_MAX_PENDING_HANDSHAKES": ("max_pending_handshakes", lambda v, n: _count(v, n)),
    "LINKESCAPE_MAX_FRAME_BYTES": ("max_frame_bytes", _size),
    "LINKESCAPE_MAX_STASH_BYTES": ("max_stash_bytes", _size),
    "LINKESCAPE_MAX_STASH_FRAMES": ("max_stash_frames", lambda v, n: _count(v, n)),
    "LINKESCAPE_MAX_UNEXPECTED_BYTES": ("max_unexpected_bytes", _size),
    "LINKESCAPE_MAX_UNEXPECTED": ("max_unexpected", lambda v, n: _count(v, n)),
    "LINKESCAPE_RELAY_WINDOW": ("relay_window", _size),
    "LINKESCAPE_TCP_RTO_MIN_MS": ("tcp_rto_min", lambda v, n: _millis_or_zero(v, n)),
    "LINKESCAPE_FRAME_AUTH": ("frame_auth", _flag),
    "LINKESCAPE_EAGER_BACKUPS": ("eager_backups", _flag),
    "LINKESCAPE_CONNECT_AT_START": ("connect_at_start", lambda v, n: v.strip().lower()),
}


@dataclass(frozen=True)
class Config:
    rails: Optional[Tuple[str, ...]] = None
    #: default deadline of every operation, seconds (torch's default is 30 min)
    timeout: float = 1800.0
    #: how long rendezvous waits for every peer to arrive
    connect_timeout: float = 300.0
    #: pipeline segment size of the large-message algorithms
    chunk_bytes: int = 1 << 20
    #: messages up to this size use the latency algorithms
    small_bytes: int = 64 << 10
    #: all_reduce of up to 3 ranks sends to every peer directly (one round)
    #: while size * (world_size - 1) stays under this
    direct_bytes: int = 4096
    #: a small all_reduce of this many ranks or more is a reduce and a
    #: broadcast tree (2(n-1) messages) rather than recursive doubling (n log2 n)
    tree_ranks: int = 16
    #: that tree's fan-out: a rank has up to radix - 1 children per level, and the
    #: tree is ceil(log_radix n) deep (2: binomial)
    tree_radix: int = 8
    #: an all_reduce above small_bytes and up to halving_bytes, of this many
    #: ranks or more, is recursive halving and doubling (2 log2 n steps)
    #: rather than a ring (2(n-1) steps)
    halving_ranks: int = 8
    halving_bytes: int = 16 << 20
    #: frames up to this size are copied into the retransmit store when sent;
    #: larger ones are sent zero-copy from the caller's memory
    copy_bytes: int = 64 << 10
    policy: str = "active-backup"
    #: links with an operation's traffic pending carry a heartbeat this often
    heartbeat_interval: float = 0.05
    #: idle and backup links probed per second per rank (whatever the number
    #: of peers; no link more than once a second)
    probe_rate: float = 10.0
    #: a link with nothing heard for this long while something is owed is dead
    silent_timeout: float = 0.2
    failback_holddown: float = 1.0
    #: cap of the re-dial back-off: with the 0.5 s dial deadline, a path that
    #: returns is found within about a second (the first path back is used at once)
    reconnect_max: float = 0.5
    #: the wait that saves most in the cost model at its defaults (`linkescape cost --break-even`,
    #: docs/operations.md): longer than most flaps and reboots, far shorter than a hardware swap
    no_path_timeout: float = 90.0
    peer_lost_timeout: float = 2.0
    events: Optional[str] = None
    #: Prometheus /metrics on this port + the rank's offset (LOCAL_RANK, else rank); None: off
    metrics_port: Optional[int] = None
    metrics_addr: str = "127.0.0.1"
    #: operations the flight recorder keeps (0: off)
    trace_buffer: int = 2000
    #: where the flight recorder dumps (timeouts, lost peers, mismatches, SIGUSR1); None: no dumps
    trace_dir: Optional[str] = None
    #: microseconds to busy-poll before blocking; None: 50 when every local
    #: rank can have a core, else 0
    spin_us: Optional[float] = None
    #: microseconds to poll with ``sched_yield`` between polls before blocking; None: 200 when the
    #: local ranks outnumber the cores by at most two to one, else 0
    yield_us: Optional[float] = None
    tcp_congestion: Optional[str] = None
    socket_buffer: Optional[int] = None
    carrier_watch: bool = True
    #: give the heap's free pages back to the system after each outage (glibc ``malloc_trim``; engine/heap.py)
    malloc_trim: bool = True
    #: fix glibc's mmap and trim thresholds at start-up, so freed large buffers leave RSS (engine/heap.py)
    malloc_thresholds: bool = True
    #: the job's shared secret (every rank the same); never printed
    auth_key: Optional[str] = field(default=None, repr=False)
    #: a file holding the key (alternative to ``auth_key``)
    auth_key_file: Optional[str] = None
    #: "required": refuse to start without auth_key or auth_key_file;
    #: "optional": without them, the per-job secret from the store
    auth: str = "optional"
    #: an incoming connection must finish the link handshake within this long
    handshake_timeout: float = 2.0
    #: incoming handshakes in progress at once; a new one evicts the least
    #: advanced. None: 64, or twice the links this rank accepts if more
    max_pending_handshakes: Optional[int] = None
    #: frame headers announcing a larger payload are protocol errors
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES
    #: frames of one peer read before they could be placed, at most (bytes, frames);
    #: beyond that its links wait unread
    max_stash_bytes: int = 64 << 20
    max_stash_frames: int = 4096
    #: point-to-point messages of one peer that arrived before their receive,
    #: at most (bytes, messages); beyond that the sender waits for the receive
    max_unexpected_bytes: int = 64 << 20
    max_unexpected: int = 1024
    #: bytes of one pair a relay holds, at most, and a relayed pair keeps unacknowledged
    relay_window: int = 4 << 20
    #: the links' minimum TCP retransmission timeout, seconds (0: the
    #: kernel's, 200 ms); set per socket where the kernel allows it (6.15+)
    tcp_rto_min: float = 0.01
    #: a MAC on every frame, keyed per link from its handshake (every rank the same)
    frame_auth: bool = False
    #: open the backup rails' links before start-up returns (default: the
    #: primary rail's, then the backups right after, off the caller's path)
    eager_backups: bool = False
    #: the peers whose links start-up opens before it returns: ``all``; ``neighbours`` (the two ring
    #: neighbours, then a store barrier; every other link is opened right after, off the caller's
    #: path, as the backups are); ``auto``: ``neighbours`` from NEIGHBOURS_FROM ranks on when the
    #: store can count (torch's stores), else ``all``
    connect_at_start: str = "auto"
    extra: Mapping[str, str] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ConfigError(f"policy {self.policy!r} is not one of {POLICIES}")
        if self.metrics_port is not None and not 1 <= self.metrics_port <= 65535:
            raise ConfigError(f"metrics_port={self.metrics_port} must be in [1, 65535]")
        if not self.metrics_addr:
            raise ConfigError("metrics_addr must name an address")
        if self.trace_buffer < 0:
            raise ConfigError(f"trace_buffer={self.trace_buffer} must be 0 (off) or more")
        if self.chunk_bytes < 64 or self.chunk_bytes % 64:
            raise ConfigError(f"chunk_bytes={self.chunk_bytes} must be a positive multiple of 64")
        if not self.probe_rate > 0:
            raise ConfigError(f"probe_rate={self.probe_rate} must be positive")
        for name in ("spin_us", "yield_us"):
            value = getattr(self, name)
            if value is not None and not 0 <= value < float("inf"):
                raise ConfigError(f"{name}={value} must be 0 (off) or more")
        for name in ("timeout", "connect_timeout", "heartbeat_interval", "silent_timeout",
                     "failback_holddown", "reconnect_max", "no_path_timeout", "peer_lost_timeout"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be positive")
        if self.auth_key is not None and self.auth_key_file is not None:
            raise ConfigError("set LINKESCAPE_AUTH_KEY or LINKESCAPE_AUTH_KEY_FILE, not both")
        if self.auth_key is not None and not self.auth_key.strip():
            raise ConfigError("LINKESCAPE_AUTH_KEY is set but empty or blank: give it the job's key, or unset it")
        if self.auth_key_file is not None and not self.auth_key_file.strip():
            raise ConfigError("LINKESCAPE_AUTH_KEY_FILE is set but empty: name the key file, or unset it")
        if self.connect_at_start not in CONNECT_MODES:
            raise ConfigError(f"LINKESCAPE_CONNECT_AT_START={self.connect_at_start!r} is not one of {CONNECT_MODES}")
        if self.auth not in AUTH_MODES:
            raise ConfigError(f"LINKESCAPE_AUTH={self.auth!r} is not one of {AUTH_MODES}")
        if self.auth == "required" and self.auth_key is None and self.auth_key_file is None:
            raise ConfigError("LINKESCAPE_AUTH=required, but no key is set: give every rank the same key with "
                              "LINKESCAPE_AUTH_KEY_FILE=FILE (mode 0600) or LINKESCAPE_AUTH_KEY")
        if self.handshake_timeout <= 0:
            raise ConfigError("handshake_timeout must be positive")
        if self.max_pending_handshakes is not None and self.max_pending_handshakes < 1:
            raise ConfigError("max_pending_handshakes must be at least 1")
        if self.chunk_bytes > self.max_frame_bytes:
            raise ConfigError(f"chunk_bytes={self.chunk_bytes} exceeds max_frame_bytes={self.max_frame_bytes}")
        if self.tree_radix < 2:
            raise ConfigError(f"tree_radix={self.tree_radix} must be at least 2 (LINKESCAPE_TREE_RADIX)")
        if self.silent_timeout <= self.heartbeat_interval:
            raise ConfigError("silent_timeout must exceed heartbeat_interval")

    @classmethod
    def from_env(cls, environ: Optional[Mapping[str, str]] = None, **overrides) -> "Config":
        env = os.environ if environ is None else environ
        values = {}
        # one pass over the environment (a lookup of os.environ is three Python calls; this is
        # one per variable set): what start-up costs, on a host with more ranks than cores
        for var in [v for v in env if v in _ENV]:
            raw = env[var]
            if raw != "" or var in _EMPTY_IS_SET:
                name, parse = _ENV[var]
                values[name] = parse(raw, var)
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)

    def replace(self, **changes) -> "Config":
        return dataclasses.replace(self, **changes)


ENV_VARS = tuple(_ENV)
