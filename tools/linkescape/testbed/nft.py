"""The nftables tables that make silent faults, and how to find them again.

One ``netdev`` table per NIC and kind inside a host, so faults compose and
each is removed on its own:

* ``le_bh_{nic}`` (blackhole): ingress and egress chains with policy drop;
* ``le_loss_{nic}`` (lossy): the same hooks, policy accept, and a rule
  ``numgen random mod 10000 < N drop``: every packet is dropped with
  probability N / 10000, independently (the carrier stays up).

On kernels without the netdev egress hook (< 5.16) the egress half is an
ingress chain on the bridge-side veth in the root namespace instead, in a
table named after the testbed (the root namespace is shared):
``{testbed}_bh_{host}_{rail}`` and ``{testbed}_loss_{host}_{rail}``.

Every script is applied by one ``nft -f -`` (one transaction): a fault is
complete, or not there at all.
"""

from __future__ import annotations

import re
import shutil
from typing import Dict, List, Optional, Sequence, Set, Tuple

from .shell import in_netns, run

BLACKHOLE_PREFIX = "le_bh_"
LOSSY_PREFIX = "le_loss_"
#: the drop probability is given in units of 1/LOSS_SCALE (0.01 %)
LOSS_SCALE = 10000
_LOSS_RE = re.compile(r"numgen random mod (\d+) < (\d+)")

Hook = Tuple[str, str, str]  # chain name, hook, device


def host_table(kind: str, nic: str) -> str:
    """Name of the table of a ``blackhole`` or ``lossy`` fault on ``nic`` inside a host."""
    return (BLACKHOLE_PREFIX if kind == "blackhole" else LOSSY_PREFIX) + nic


def root_table(kind: str, testbed: str, host: int, rail_tag: str) -> str:
    """Root-namespace table of the ingress-only fallback (prefixed with the testbed's name)."""
    return f"{testbed}_{'bh' if kind == 'blackhole' else 'loss'}_{host}_{rail_tag}"


def apply(netns: Optional[str], script: str, *, check: bool = True, what: str = "nft"):
    """Run an nft script inside ``netns`` (None: the root namespace)."""
    return run(in_netns(netns, ["nft", "-f", "-"]), input=script, check=check, what=what)


def drop_table(table: str, hooks: Sequence[Hook]) -> str:
    """A table whose chains drop every packet."""
    return _table(table, [f'  chain {c} {{ type filter hook {h} device "{d}" priority 0; policy drop; }}'
                          for c, h, d in hooks])


def loss_table(table: str, hooks: Sequence[Hook], units: int) -> str:
    """A table whose chains drop each packet with probability ``units / LOSS_SCALE``."""
    return _table(table, [f'  chain {c} {{ type filter hook {h} device "{d}" priority 0; policy accept; '
                          f'numgen random mod {LOSS_SCALE} < {int(units)} drop; }}' for c, h, d in hooks])


def _table(table: str, chains: List[str]) -> str:
    # Declare-then-delete makes the replacement idempotent and atomic: nft
    # applies the whole script as one transaction.
    lines = [f"table netdev {table} {{}}", f"delete table netdev {table}", f"table netdev {table} {{"]
    lines += chains
    lines.append("}")
    return "\n".join(lines) + "\n"


def delete_table(table: str) -> str:
    """A script that removes ``table`` whether or not it exists."""
    return f"table netdev {table} {{}}\ndelete table netdev {table}\n"


def tables(netns: Optional[str]) -> Set[str]:
    """Names of the ``netdev`` tables inside ``netns`` (None: the root namespace)."""
    if not shutil.which("nft"):
        return set()
    proc = run(in_netns(netns, ["nft", "list", "tables", "netdev"]), check=False)
    return {line.split()[2] for line in proc.stdout.splitlines()
            if line.startswith("table netdev ") and len(line.split()) >= 3}


def blackholed_nics(netns: str, found: Optional[Set[str]] = None) -> Set[str]:
    """NIC names inside ``netns`` that currently have a drop table."""
    found = tables(netns) if found is None else found
    return {t[len(BLACKHOLE_PREFIX):] for t in found if t.startswith(BLACKHOLE_PREFIX)}


def lossy_nics(netns: str, found: Optional[Set[str]] = None) -> Dict[str, Optional[float]]:
    """NIC name -> drop share in percent (None if unreadable) of every lossy NIC inside ``netns``."""
    found = tables(netns) if found is None else found
    out: Dict[str, Optional[float]] = {}
    for t in sorted(found):
        if not t.startswith(LOSSY_PREFIX):
            continue
        proc = run(in_netns(netns, ["nft", "list", "table", "netdev", t]), check=False)
        m = _LOSS_RE.search(proc.stdout)
        out[t[len(LOSSY_PREFIX):]] = 100.0 * int(m.group(2)) / int(m.group(1)) if m else None
    return out


def delete_root_tables(testbed: str) -> List[str]:
    """Remove the root-namespace fallback tables of testbed ``testbed`` (used by down)."""
    pat = re.compile(rf"^{re.escape(testbed)}_(bh|loss)_\d+_(\d+|m)$")
    gone = [t for t in tables(None) if pat.match(t)]
    for t in gone:
        apply(None, delete_table(t), check=False)
    return gone


__all__ = ["host_table", "root_table", "apply", "drop_table", "loss_table", "delete_table", "tables",
           "blackholed_nics", "lossy_nics", "delete_root_tables", "LOSS_SCALE"]
