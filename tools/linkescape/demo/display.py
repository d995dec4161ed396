"""Live progress of a demo run: a rich Live panel on a terminal, plain lines elsewhere."""

from __future__ import annotations

import sys
import threading
import time
from typing import Any, List, Optional

from .live import LiveState
from ..tools.timeline import fault_timing, format_ms


class NullDisplay:
    """--quiet: nothing while running."""

    def __init__(self, state: LiveState) -> None:
        self.state = state

    def refresh(self) -> None:
        pass

    def __enter__(self) -> "NullDisplay":
        return self

    def __exit__(self, *exc: Any) -> None:
        pass


class PlainDisplay(NullDisplay):
    """Line output for logs and CI: every fault and event as it happens, progress now and then."""

    def __init__(self, state: LiveState, stream=None) -> None:
        super().__init__(state)
        self.stream = stream or sys.stdout
        self.t0 = time.time()
        self.lock = threading.Lock()
        self.last_step = -1
        self.every = max(1, state.steps_total // 20)

    def _print(self, ts: float, text: str) -> None:
        with self.lock:
            self.stream.write(f"[{ts - self.t0:7.2f}s] {text}\n")
            self.stream.flush()

    def _on_line(self, ts: float, text: str, style: str) -> None:
        self._print(ts, text)

    def refresh(self) -> None:
        st = self.state
        with st.lock:
            steps = list(st.steps[self.last_step + 1:])
        for s in steps:
            k = s["step"]
            if k % self.every == 0 or k == st.steps_total - 1:
                traffic = "; ".join(f"h{h} {st.traffic_on(h)}" for h in range(st.hosts))
                self._print(s["t"], f"step {k + 1:>4}/{st.steps_total} loss {s['loss']:.4f} "
                                    f"({s['dt']:.3f} s/step)  traffic {traffic}")
            self.last_step = k

    def __enter__(self) -> "PlainDisplay":
        st = self.state
        what = "faults injected" if st.run_name == "faulty" else "no faults (reference)"
        self._print(time.time(), f"{st.title}: {st.run_name} run, {what}")
        with st.lock:
            st.listeners.append(self._on_line)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.refresh()
        with self.state.lock:
            if self._on_line in self.state.listeners:
                self.state.listeners.remove(self._on_line)
            n = len(self.state.steps)
        self._print(time.time(), f"{self.state.run_name} run ended: {n}/{self.state.steps_total} steps recorded")


_STATE_STYLE = {"up": "green", "CUT": "bold white on red", "BLACKHOLED": "bold white on magenta",
                "FLAPPING (down)": "bold black on yellow", "FLAPPING (up)": "yellow"}


class LiveDisplay(NullDisplay):
    """A rich Live panel: step and loss, every host's rails, the faults, the latest events."""

    def __init__(self, state: LiveState, console=None, events_shown: int = 10) -> None:
        super().__init__(state)
        from rich.console import Console

        self.console = console or Console()
        self.events_shown = events_shown
        self.live = None
        self.t0 = time.time()
        self._last = 0.0

    def render(self):
        from rich.console import Group
        from rich.panel import Panel
        from rich.table import Table
        from rich.text import Text

        st = self.state
        with st.lock:
            steps = list(st.steps)
            rail_state = dict(st.rail_state)
            rates = [list(r) for r in st.rates] if st.rates is not None else None
            lines = list(st.lines[-self.events_shown:])
            faults = list(st.faults)
            events = list(st.events)
            t_start = st.t_start
            finished = st.finished
        now = time.time()
        head = Text()
        head.append(st.title + "\n", style="bold")
        head.append("one rank per host (rank i on host i), DDP over the linkescape backend\n", style="dim")
        if st.run_name == "faulty":
            head.append("faulty run: ", style="bold")
            head.append("a cable is cut, an optic blackholed, a link flapped; training must not notice\n")
        else:
            head.append("reference run: ", style="bold")
            head.append("the same training without faults, to compare bit for bit\n")
        if steps:
            s = steps[-1]
            head.append(f"step {s['step'] + 1}/{st.steps_total}   ", style="bold cyan")
            head.append(f"loss {s['loss']:.4f}   {s['dt']:.3f} s/step   ")
        else:
            head.append("starting torch and the process group ...   " if not finished else "", style="dim")
        ref = t_start if t_start is not None else self.t0
        head.append(f"elapsed {now - ref:5.1f} s" + ("   done" if finished else ""), style="dim")

        rails = Table(box=None, padding=(0, 2), show_edge=False)
        rails.add_column("host", style="bold")
        for r in range(st.rails):
            rails.add_column(f"rail {r} (r{r})")
            rails.add_column("tx Mbit/s", justify="right")
        rails.add_column("its traffic to each peer goes on")
        for h in range(st.hosts):
            row: List[Any] = [f"h{h}"]
            for r in range(st.rails):
                state = rail_state.get((h, r), "up")
                row.append(Text(state, style=_STATE_STYLE.get(state, "")))
                row.append(f"{rates[h][r]:6.0f}" if rates is not None and h < len(rates) else "-")
            row.append(st.traffic_on(h))
            rails.add_row(*row)

        parts = [head, Text(""), rails]
        if faults:
            ft = Table(box=None, padding=(0, 2), show_edge=False, title_justify="left")
            ft.add_column("fault", style="bold")
            ft.add_column("at", justify="right")
            ft.add_column("detected after", justify="right")
            ft.add_column("repaired at", justify="right")
            ft.add_column("back on primary after", justify="right")
            for f in faults:
                timing = fault_timing(f, events)
                ft.add_row(f.label,
                           "planned" if f.ts is None else f"{f.ts - ref:5.1f} s",
                           format_ms(timing["detection_ms"]),
                           "-" if f.restored is None else f"{f.restored - ref:5.1f} s",
                           format_ms(timing["recovery_ms"]))
            parts += [Text(""), ft]
        ev = Text()
        for i, (ts, text, style) in enumerate(lines):
            ev.append(f"{ts - ref:7.2f}s  ", style="dim")
            ev.append(text + ("\n" if i < len(lines) - 1 else ""), style=style)
        parts += [Text(""), Panel(ev if lines else Text("no link events yet", style="dim"),
                                  title="events (tail of every rank's LINKESCAPE_EVENTS file)",
                                  title_align="left")]
        return Panel(Group(*parts), title="linkescape demo", border_style="blue")

    def refresh(self, force: bool = False) -> None:
        # at most 4 frames a second: the controller shares the CPUs with the ranks
        now = time.monotonic()
        if self.live is not None and (force or now - self._last >= 0.25):
            self._last = now
            self.live.update(self.render(), refresh=True)

    def __enter__(self) -> "LiveDisplay":
        from rich.live import Live

        self.live = Live(self.render(), console=self.console, auto_refresh=False, transient=False,
                         redirect_stdout=False, redirect_stderr=False)
        self.live.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.live is not None:
            self.live.update(self.render(), refresh=True)
            self.live.__exit__(*exc)
            self.live = None


def make_display_factory(quiet: bool, live: Optional[bool], console=None):
    """``factory(state) -> display`` for the options and the terminal."""
    from rich.console import Console

    console = console or Console()
    use_live = console.is_terminal if live is None else live

    def factory(state: LiveState):
        if quiet:
            return NullDisplay(state)
        if use_live:
            return LiveDisplay(state, console=console)
        return PlainDisplay(state)

    return factory


__all__ = ["LiveDisplay", "PlainDisplay", "NullDisplay", "make_display_factory"]
