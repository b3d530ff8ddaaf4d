"""Live per-host progress of a flow on a terminal: hosts in flight with their current step, and the tally."""

from __future__ import annotations

import threading

from rich.live import Live
from rich.table import Table
from rich.text import Text

from gpuk8s import ui
from gpuk8s.install.prepare import Event

STYLE = {"done": "green", "failed": "red", "blocked": "red", "unreachable": "red", "busy": "yellow"}


class LiveView:
    """Per-host progress on a terminal: hosts in flight with their current step, and the tally.

    Step names and statuses come from hosts: cells are `ui.safe` text, never markup.
    """

    def __init__(self, total: int) -> None:
        self.total = total
        self.current: dict[str, str] = {}
        self.finished: dict[str, str] = {}
        self.lock = threading.Lock()
        self.live = Live(self.render(), console=ui.console(stderr=True), refresh_per_second=8, transient=True)

    def render(self) -> Table:
        t = Table(box=None, show_header=False)
        t.add_column("host")
        t.add_column("progress")
        for name, text in list(self.current.items())[:20]:
            t.add_row(ui.safe(name, single_line=True), ui.safe(text, single_line=True))
        n_failed = sum(1 for s in self.finished.values() if s != "done")
        t.add_row(Text(""), Text(f"{len(self.finished)}/{self.total} hosts finished, {n_failed} not done",
                                 style="bold"))
        return t

    def event(self, e: Event) -> None:
        with self.lock:
            if e.kind == "preflight":
                if e.status == "ok":
                    self.current[e.host] = "preflight passed"
                else:
                    self.finished[e.host] = e.status
                    ui.say(self.live.console, f"{e.host}: blocked by preflight", "red")
            elif e.kind == "step":
                self.current[e.host] = f"step {e.index}/{e.total} {e.step}: {e.status}"
            else:
                self.current.pop(e.host, None)
                self.finished[e.host] = e.status
                ui.say(self.live.console, f"{e.host}: {e.status}", STYLE.get(e.status))
            self.live.update(self.render())
