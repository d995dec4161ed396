"""Live progress of a chaos run: faults active, operations verified, the current stall.

A rich ``Live`` panel on a terminal; otherwise one plain line every 10 s.
The *current stall* is how long the oldest outstanding step on any rank has
been running (its normal time is only known after the run).
"""

from __future__ import annotations

import time
from typing import Any, Callable, List, Optional, Sequence

from .ranks import RankState


class LiveView:
    def __init__(self, *, seed: int, duration: float, live: Optional[bool] = None,
                 say: Callable[[str], None] = print) -> None:
        import sys

        self.seed = seed
        self.duration = duration
        self.say = say
        self.live_on = sys.stdout.isatty() if live is None else live
        self._live = None
        self._last_line = 0.0
        self.longest_outstanding = 0.0
        self.faults_seen = 0

    def __enter__(self) -> "LiveView":
        if self.live_on:
            from rich.live import Live

            self._live = Live(self._render(0.0, [], [], 0), refresh_per_second=4, transient=False)
            self._live.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._live is not None:
            self._live.__exit__(*exc)
            self._live = None

    def update(self, elapsed: float, states: Sequence[RankState], active: List[str], faults_done: int) -> None:
        now = time.time()
        cur = max([s.outstanding(now) or 0.0 for s in states] + [0.0])
        self.longest_outstanding = max(self.longest_outstanding, cur)
        if self._live is not None:
            self._live.update(self._render(elapsed, states, active, faults_done))
        elif now - self._last_line >= 10.0:
            self._last_line = now
            verified = sum(s.progress.get("verified", 0) for s in states)
            wrong = sum(s.progress.get("wrong", 0) for s in states)
            self.say(f"  [{elapsed:6.0f}s/{self.duration:.0f}s] faults done {faults_done}, active {len(active)}; "
                     f"verified {verified}, wrong {wrong}; current stall {cur:.2f}s "
                     f"(longest {self.longest_outstanding:.2f}s)")

    def _render(self, elapsed: float, states: Sequence[RankState], active: List[str], faults_done: int):
        from rich.panel import Panel
        from rich.table import Table

        now = time.time()
        t = Table.grid(padding=(0, 2))
        t.add_column(justify="right")
        t.add_column()
        verified = sum(s.progress.get("verified", 0) for s in states)
        wrong = sum(s.progress.get("wrong", 0) for s in states)
        cur = max([s.outstanding(now) or 0.0 for s in states] + [0.0])
        t.add_row("time", f"{elapsed:.0f} / {self.duration:.0f} s   seed {self.seed}")
        t.add_row("faults", f"{faults_done} done, {len(active)} active")
        for label in active[:6]:
            t.add_row("", f"[yellow]{label}[/]")
        t.add_row("verified", f"{verified} operations, [{'red' if wrong else 'green'}]{wrong} wrong[/]")
        t.add_row("stall", f"current {cur:.2f} s, longest outstanding {self.longest_outstanding:.2f} s")
        for s in states:
            out = s.outstanding(now)
            status = ("[red]exited[/]" if s.exit else f"step {s.progress.get('step')} outstanding {out:.2f}s"
                      if out is not None else "between steps")
            t.add_row(f"rank {s.rank}", f"{s.progress.get('steps', 0)} steps  {status}")
        return Panel(t, title="linkescape chaos", border_style="cyan")


__all__ = ["LiveView"]
