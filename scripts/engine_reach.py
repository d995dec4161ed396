"""How the engine's parts reach into each other (issue 49), counted from the source with ast:
the Receiver's uses of its PeerChannel, the Driver's and Recovery's uses of the engine, the chains
from core.py and completion.py into Sender and Receiver internals (and which of them write), and
the lines of the modules the issue names.

    python scripts/engine_reach.py [REPO]   (REPO: a checkout, default: this one)
"""
import ast, pathlib, sys, collections
src = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).resolve().parents[1]) / "src/linkescape/engine"
def reach(mod, bases):
    tree = ast.parse((src / mod).read_text())
    c = collections.Counter()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            b = node.value
            if isinstance(b, ast.Name) and b.id in bases:
                c[node.attr] += 1
            elif isinstance(b, ast.Attribute) and isinstance(b.value, ast.Name) and b.value.id == "self" and b.attr in bases:
                c[node.attr] += 1
    return c
def chains(mod):
    tree = ast.parse((src / mod).read_text())
    out = collections.Counter(); writes = collections.Counter()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute) and node.value.attr in ("sender", "receiver"):
            key = f"{node.value.attr}.{node.attr}"
            out[key] += 1
            if isinstance(node.ctx, ast.Store):
                writes[key] += 1
    return out, writes
for mod, bases in (("receiver.py", {"peer"}), ("driver.py", {"engine", "eng"}), ("recovery.py", {"engine", "eng"})):
    c = reach(mod, bases)
    print(f"{mod}: {sum(c.values())} uses over {len(c)} attributes")
tot = collections.Counter(); w = collections.Counter()
for mod in ("core.py", "completion.py"):
    o, ww = chains(mod); tot += o; w += ww
print(f"core+completion -> sender/receiver internals: {len(tot)} chains ({sum(tot.values())} uses), writes: {dict(w)}")
for f in ("peer.py", "core.py", "recovery.py", "peer_timers.py", "receiver.py"):
    print(f, len((src / f).read_text().splitlines()))
