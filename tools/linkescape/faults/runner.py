"""Play a fault schedule through an injector, in a background thread, and record what happened.

:class:`ScheduleRunner` applies every :class:`~linkescape.faults.schedule.Step`
at its planned wall time (``t0 + step.t``; late steps run at once, and how
late is recorded). Overlapping faults on one NIC are counted per mechanism:
a mechanism is made when the first fault needs it and repaired when the
last one ends (for ``lossy`` the newest share applies). :meth:`stop` (or the
end of the plan) always leaves every NIC repaired.

Everything it did is in :attr:`log` (one dict per step: the plan, the wall
time it took effect, how late, any error) and :meth:`intervals` (when each
mechanism really was in effect on each NIC), which is what analyses should
use rather than the plan.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

from .injectors import Injector
from .schedule import Fault, Schedule, Step

Key = Tuple[int, int, str]  # host, rail, mechanism


class ScheduleRunner:
    """``runner = ScheduleRunner(schedule, injector).start(); ...; runner.stop()``."""

    def __init__(self, schedule: Schedule, injector: Injector, *,
                 on_step: Optional[Callable[[Dict[str, Any]], None]] = None) -> None:
        injector.check(schedule)
        self.schedule = schedule
        self.injector = injector
        self.on_step = on_step
        self.log: List[Dict[str, Any]] = []
        self.error: Optional[BaseException] = None
        self.t0: Optional[float] = None
        self._held: Dict[Key, List[Tuple[int, Optional[float]]]] = {}  # fault ids (and loss) needing it
        self._on_since: Dict[Key, float] = {}
        self._done_ivs: List[Tuple[float, float, int, int, str]] = []
        self._started: Dict[int, float] = {}
        self._ended: Dict[int, float] = {}
        self._steps_left: Dict[int, int] = {}
        for st in schedule.steps():
            self._steps_left[st.fault] = self._steps_left.get(st.fault, 0) + 1
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._main, name="fault-schedule", daemon=True)

    # ------------------------------------------------------------ lifecycle
    def start(self, t0: Optional[float] = None) -> "ScheduleRunner":
        """Start playing; offset 0 of the plan is wall time ``t0`` (default: now)."""
        self.t0 = time.time() if t0 is None else float(t0)
        self._thread.start()
        return self

    def join(self, timeout: Optional[float] = None) -> bool:
        """Wait for the plan to end; True if it did."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def stop(self, timeout: float = 30.0) -> List[Dict[str, Any]]:
        """Stop early (or after the end): every NIC is repaired. Returns the log."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)
        self._repair_everything()
        return self.log

    def __enter__(self) -> "ScheduleRunner":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # ------------------------------------------------------------ playing
    def _main(self) -> None:
        try:
            for step in self.schedule.steps():
                due = self.t0 + step.t
                if self._stop.wait(max(0.0, due - time.time())):
                    return
                self._play(step, due)
        finally:
            self._repair_everything()

    def _play(self, step: Step, due: float) -> None:
        key = (step.host, step.rail, step.mechanism)
        rec: Dict[str, Any] = {"fault": step.fault, "kind": self.schedule.by_id(step.fault).kind,
                               "action": step.action, "mechanism": step.mechanism, "host": step.host,
                               "rail": step.rail, "planned": due, "ts": None, "late": None, "error": None}
        if step.loss is not None:
            rec["loss"] = step.loss
        issued = time.time()
        rec["late"] = max(0.0, issued - due)
        with self._lock:
            try:
                rec["ts"] = self._change(key, step)
            except Exception as exc:  # noqa: BLE001 - recorded; the plan goes on so repairs still happen
                rec["ts"] = time.time()
                rec["error"] = f"{type(exc).__name__}: {exc}"
                if self.error is None:
                    self.error = exc
            if step.action == "apply":
                self._started.setdefault(step.fault, rec["ts"])
            self._steps_left[step.fault] -= 1
            if self._steps_left[step.fault] == 0:
                self._ended[step.fault] = rec["ts"]
            self.log.append(rec)
        if self.on_step is not None:
            try:
                self.on_step(dict(rec))
            except Exception:  # noqa: BLE001 - a display must not stop the faults
                pass

    def _change(self, key: Key, step: Step) -> float:
        held = self._held.setdefault(key, [])
        host, rail, mech = key
        if step.action == "apply":
            newest = held[-1][1] if held else None
            held.append((step.fault, step.loss))
            if len(held) == 1 or (mech == "lossy" and step.loss != newest):
                # Held before it is made: a failed change may have half happened, and is repaired anyway.
                self._on_since.setdefault(key, time.time())
                ts = self.injector.apply(mech, host, rail, loss=step.loss)
                if len(held) == 1:
                    self._on_since[key] = ts
                return ts
            return time.time()
        before = held[-1][1] if held else None
        for i in range(len(held) - 1, -1, -1):
            if held[i][0] == step.fault:
                del held[i]
                break
        else:
            return time.time()  # not held by this fault: nothing to undo
        if not held:
            ts = self.injector.repair(mech, host, rail)
            since = self._on_since.pop(key, None)
            if since is not None:
                self._done_ivs.append((since, ts, host, rail, mech))
            return ts
        if mech == "lossy" and held[-1][1] != before:
            return self.injector.apply(mech, host, rail, loss=held[-1][1])
        return time.time()

    def _repair_everything(self) -> None:
        with self._lock:
            for key, held in list(self._held.items()):
                if not held:
                    continue
                host, rail, mech = key
                ids = [fid for fid, _ in held]
                held.clear()
                try:
                    ts = self.injector.repair(mech, host, rail)
                except Exception as exc:  # noqa: BLE001
                    ts = time.time()
                    if self.error is None:
                        self.error = exc
                since = self._on_since.pop(key, None)
                if since is not None:
                    self._done_ivs.append((since, ts, host, rail, mech))
                for fid in ids:
                    self._ended.setdefault(fid, ts)
                    self.log.append({"fault": fid, "kind": self.schedule.by_id(fid).kind, "action": "repair",
                                     "mechanism": mech, "host": host, "rail": rail, "planned": None, "ts": ts,
                                     "late": None, "error": None, "early": True})

    # ------------------------------------------------------------ views
    def intervals(self, now: Optional[float] = None) -> List[Tuple[float, float, int, int, str]]:
        """When each mechanism really was in effect: ``(t0, t1, host, rail, mechanism)``, wall times.
        A mechanism still in effect ends at ``now``."""
        now = time.time() if now is None else now
        with self._lock:
            out = list(self._done_ivs)
            out += [(since, now, h, r, m) for (h, r, m), since in self._on_since.items()]
        return sorted(out)

    def fault_times(self) -> Dict[int, Dict[str, Optional[float]]]:
        """Per fault id: ``start`` (its first change took effect) and ``end`` (its last repair)."""
        with self._lock:
            return {f.id: {"start": self._started.get(f.id), "end": self._ended.get(f.id)}
                    for f in self.schedule.faults if f.id in self._started}

    def active(self) -> List[Fault]:
        """Faults that started and are not over yet."""
        with self._lock:
            return [self.schedule.by_id(fid) for fid in self._started if fid not in self._ended]

    def errors(self) -> List[Dict[str, Any]]:
        with self._lock:
            return [r for r in self.log if r.get("error")]


__all__ = ["ScheduleRunner"]
