"""Interrupting a gpuk8s command as a user's machine would (issue 41, docs/testing.md's interruption matrix): the
client killed with SIGKILL (no handler, no cleanup: a lost laptop, an OOM kill, a closed CI job) at a point read from
its own log file, then the same command again.

Where a kill lands is found in the log gpuk8s writes anyway (GPUK8S_LOG_FILE): a phase's end is its line
`gpuk8s.phases: phase NAME: STATUS`, a remote command's end its `gpuk8s.remote: HOST: $ COMMAND -> RC` line. The kill
follows the line by the time the test's poll takes (~20 ms): inside whatever comes next, as a real interruption.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

PHASE_END = re.compile(r" gpuk8s\.phases: phase (\S+): (\S+)")


@dataclass
class Kill:
    """One run of a command and where it was killed (killed False: it ended by itself first)."""

    args: tuple[str, ...]
    killed: bool
    rc: int | None
    log: Path
    phases: list[str] = field(default_factory=list)  # the phases it ended, in order, before the kill
    after: str = ""  # the log line the kill followed

    @property
    def stdout(self) -> str:
        return self.log.with_suffix(".out").read_text()

    def where(self) -> str:
        return f"after {self.after!r}" if self.killed else f"ran to its end (exit {self.rc})"


def run_killed(tmp_path: Path, args: tuple[str, ...], *, phase_ends: int | None = None,
               line: re.Pattern[str] | None = None, delay: float = 0.0, timeout: float = 300,
               act: Callable[[], None] | None = None) -> Kill:
    """Run `python -m gpuk8s ARGS`; SIGKILL it `delay` seconds after its log holds `phase_ends` phase ends, or a line
    matching `line` (whichever is given); a run that ends first is not killed. With `act`, that is called there
    instead of the kill (something changing under the run), and the run goes on to its end."""
    n = len(list(tmp_path.glob("killed-*.log")))
    log = tmp_path / f"killed-{n}.log"
    env = {**os.environ, "GPUK8S_LOG_FILE": str(log), "NO_COLOR": "1"}
    with (tmp_path / f"killed-{n}.out").open("w") as stdout:  # what it printed (its JSON report with -o json)
        p = subprocess.Popen([sys.executable, "-m", "gpuk8s", *args], env=env, cwd=tmp_path,
                             stdin=subprocess.DEVNULL, stdout=stdout, stderr=subprocess.DEVNULL)
    seen: list[str] = []
    after = ""
    pos = 0
    partial = ""
    t0 = time.monotonic()
    try:
        while p.poll() is None:
            assert time.monotonic() - t0 < timeout, f"{args} ran past {timeout} s"
            try:
                with log.open() as f:
                    f.seek(pos)
                    chunk = f.read()
                    pos = f.tell()
            except FileNotFoundError:
                chunk = ""
            lines = (partial + chunk).split("\n")
            partial = lines.pop()
            hit = False
            for ln in lines:
                m = PHASE_END.search(ln)
                if m:
                    seen.append(m.group(1))
                if (phase_ends is not None and m and len(seen) >= phase_ends) or (line is not None and line.search(ln)):
                    after, hit = ln.split(" ", 3)[-1][:200], True
                    break
            if hit and act is not None:
                act()
                act, phase_ends, line = None, None, None
                continue
            if hit:
                time.sleep(delay)
                if p.poll() is not None:
                    break
                p.kill()
                p.wait(timeout=30)
                return Kill(args, True, None, log, seen, after)
            time.sleep(0.02)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(timeout=30)
    with log.open() if log.exists() else open(os.devnull) as f:  # the phases it ended after the last look
        f.seek(pos)
        seen += [m.group(1) for m in PHASE_END.finditer(partial + f.read())]
    return Kill(args, False, p.returncode, log, seen)


# Which phase boundaries a chain kills at: "all" (make test-interruptions), or by default a rotating half (make
# test): the odd boundaries on even days of the year, the even ones on odd days, so that two days' CI runs meet
# every boundary and each run of make test stays short. GPUK8S_INTERRUPT=odd or even picks one half by hand.
SAMPLE_ENV = "GPUK8S_INTERRUPT"


def sample() -> str:
    want = os.environ.get(SAMPLE_ENV, "")
    if want in ("all", "odd", "even"):
        return want
    return "odd" if time.gmtime().tm_yday % 2 == 0 else "even"


def half(items: list[str]) -> list[str]:
    """The items of today's sample (above): the odd-numbered (1st, 3rd, ...) or the even-numbered, or all."""
    which = sample()
    return items if which == "all" else [x for i, x in enumerate(items, 1) if i % 2 == (1 if which == "odd" else 0)]


def every_phase_end(tmp_path: Path, args: tuple[str, ...], max_runs: int = 40) -> list[Kill]:
    """The command killed after its first phase's end, run again and killed after its second's, and so on, until a
    run ends by itself: every phase boundary of the sample (above) is met by a kill, each run resuming what the one
    before left. Returns the runs; the last one ran to its end."""
    runs: list[Kill] = []
    which = sample()
    for k in range(1, max_runs + 1):
        if which != "all" and k % 2 != (1 if which == "odd" else 0):
            continue
        r = run_killed(tmp_path, args, phase_ends=k)
        runs.append(r)
        if not r.killed:
            return runs
    raise AssertionError(f"{args}: still killed after {max_runs} runs: {[r.where() for r in runs]}")
