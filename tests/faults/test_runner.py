"""Playing a schedule: overlapping faults compose, every NIC ends repaired, the log is the truth."""

from __future__ import annotations

import threading
import time

import pytest

from linkescape.faults import EmulatedInjector, Injector, ScheduleRunner, UnsupportedFault, scripted


class Recorder(Injector):
    """An injector that only records calls (the unit under test is the runner)."""

    def __init__(self, fail_on=None):
        self.calls = []
        self.fail_on = fail_on
        self.lock = threading.Lock()

    def apply(self, mechanism, host, rail, *, loss=None):
        with self.lock:
            if self.fail_on == (mechanism, host, rail):
                raise RuntimeError("nft exploded")
            self.calls.append(("apply", mechanism, host, rail, loss))
        return time.time()

    def repair(self, mechanism, host, rail):
        with self.lock:
            self.calls.append(("repair", mechanism, host, rail, None))
        return time.time()


def _play(faults, injector, hosts=2, rails=2, **kw):
    s = scripted(faults, hosts=hosts, rails=rails, **kw)
    r = ScheduleRunner(s, injector).start()
    assert r.join(10)
    return r


def test_overlapping_faults_on_one_nic_apply_once_and_repair_with_the_last():
    inj = Recorder()
    r = _play([{"kind": "cut", "host": 0, "rail": 0, "at": 0.0, "hold": 0.2},
               {"kind": "isolate", "targets": [[0, 0], [0, 1]], "at": 0.1, "hold": 0.2},
               {"kind": "blackhole", "host": 0, "rail": 0, "at": 0.05, "hold": 0.1}], inj)
    cut00 = [c for c in inj.calls if c[1:4] == ("cut", 0, 0)]
    assert [c[0] for c in cut00] == ["apply", "repair"]  # once down, once up, though two faults needed it
    bh = [c[0] for c in inj.calls if c[1] == "blackhole"]
    assert bh == ["apply", "repair"]
    ivs = r.intervals()
    (cut_iv,) = [iv for iv in ivs if iv[2:] == (0, 0, "cut")]
    first = next(rec for rec in r.log if rec["fault"] == 0 and rec["action"] == "apply")
    last = next(rec for rec in r.log if rec["fault"] == 1 and rec["action"] == "repair" and rec["rail"] == 0)
    assert cut_iv[:2] == (first["ts"], last["ts"])  # from the cut's start to the isolate's end
    assert not r.active() and not r.errors()
    assert set(r.fault_times()) == {0, 1, 2}


def test_lossy_overlap_uses_the_newest_share_and_repairs_at_the_end():
    inj = Recorder()
    _play([{"kind": "lossy", "host": 1, "rail": 1, "at": 0.0, "hold": 0.3, "loss": 2},
           {"kind": "lossy", "host": 1, "rail": 1, "at": 0.1, "hold": 0.1, "loss": 15}], inj)
    assert inj.calls == [("apply", "lossy", 1, 1, 2.0), ("apply", "lossy", 1, 1, 15.0),
                         ("apply", "lossy", 1, 1, 2.0), ("repair", "lossy", 1, 1, None)]


def test_stop_early_repairs_everything_and_says_so():
    inj = Recorder()
    s = scripted([{"kind": "cut", "host": 0, "rail": 1, "at": 0.0, "hold": 30},
                  {"kind": "cut", "host": 1, "rail": 0, "at": 20, "hold": 1}], hosts=2, rails=2)
    r = ScheduleRunner(s, inj).start()
    deadline = time.monotonic() + 5
    while not inj.calls and time.monotonic() < deadline:
        time.sleep(0.01)
    assert [f.id for f in r.active()] == [0]
    log = r.stop()
    assert inj.calls == [("apply", "cut", 0, 1, None), ("repair", "cut", 0, 1, None)]
    assert log[-1]["early"] and log[-1]["action"] == "repair"
    assert not r.running


def test_a_failed_step_is_recorded_and_the_plan_goes_on():
    inj = Recorder(fail_on=("blackhole", 0, 0))
    r = _play([{"kind": "blackhole", "host": 0, "rail": 0, "at": 0.0, "hold": 0.1},
               {"kind": "cut", "host": 1, "rail": 1, "at": 0.05, "hold": 0.1}], inj)
    assert isinstance(r.error, RuntimeError)
    assert [e["mechanism"] for e in r.errors()] == ["blackhole"]
    assert ("repair", "blackhole", 0, 0, None) in inj.calls  # it may have half happened: undone anyway
    assert [c[0] for c in inj.calls if c[1] == "cut"] == ["apply", "repair"]


def test_late_steps_run_at_once_and_the_lag_is_recorded():
    inj = Recorder()
    s = scripted([{"kind": "cut", "host": 0, "rail": 0, "at": 0.0, "hold": 0.1}], hosts=2, rails=2)
    r = ScheduleRunner(s, inj).start(t0=time.time() - 5.0)  # 5 s behind already
    assert r.join(5)
    assert all(rec["late"] >= 4.5 for rec in r.log)


def test_an_emulated_injector_refuses_lossy_before_anything_runs():
    inj = EmulatedInjector(lambda host, action, rail: time.time())
    s = scripted([{"kind": "lossy", "host": 0, "rail": 0, "at": 0.0, "hold": 0.1, "loss": 3}], hosts=2, rails=2)
    with pytest.raises(UnsupportedFault):
        ScheduleRunner(s, inj)
    assert "lossy" not in inj.kinds() and "isolate" in inj.kinds()


def test_emulated_injector_keeps_the_rail_down_until_the_last_mechanism_ends():
    sent = []
    inj = EmulatedInjector(lambda host, action, rail: sent.append((host, action, rail)) or time.time())
    inj.apply("blackhole", 1, 0)
    inj.apply("cut", 1, 0)
    inj.repair("cut", 1, 0)  # a blackhole is still there: the rail must stay (silently) down
    inj.repair("blackhole", 1, 0)
    inj.repair("blackhole", 1, 0)  # repeating is harmless
    inj.apply("cut", 0, 1)
    inj.apply("cut", 0, 1)
    inj.repair("cut", 0, 1)
    assert sent == [(1, "blackhole", 0), (1, "cut", 0), (1, "restore", 0), (1, "blackhole", 0), (1, "restore", 0),
                    (0, "cut", 1), (0, "restore", 1)]
