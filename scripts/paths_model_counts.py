"""What one run of the PeerPaths model (tests/protocol/test_paths_model.py) checks: cases, simulated
ticks, faults and the events the two ends emitted, counted by wrapping the model (issue 49).

    python scripts/paths_model_counts.py
"""
import collections, sys, time
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1] / "tests" / "protocol"))
import test_paths_model as M
from hypothesis.stateful import run_state_machine_as_test
c = collections.Counter()
orig_start, orig_carrier, orig_black, orig_step, orig_act = M.PairMachine.start, M.Pair.set_carrier, M.Pair.set_black, M.Pair.step, M.Pair.act
def start(self):
    c["cases"] += 1; orig_start(self)
def set_carrier(self, me, rail, up):
    if self.carrier[me][rail] != up: c["carrier changes"] += 1
    orig_carrier(self, me, rail, up)
def set_black(self, rail, black):
    if black and not self.black[rail]: c["black holes"] += 1
    orig_black(self, rail, black)
def step(self):
    c["ticks"] += 1; orig_step(self)
def act(self, me, a):
    if isinstance(a, M.P.Emit): c["ev " + a.event + ("/" + a.cause if a.event == "relay_off" else "")] += 1
    if a is M.P.RELAY_BEAT: c["relay beats"] += 1
    orig_act(self, me, a)
M.PairMachine.start = M.initialize()(start)
M.Pair.set_carrier, M.Pair.set_black, M.Pair.step, M.Pair.act = set_carrier, set_black, step, act
t = time.time()
run_state_machine_as_test(M.PairMachine, settings=M.SETTINGS)
print(round(time.time() - t, 1), "s"); [print(k, v) for k, v in sorted(c.items())]
