"""Install, part 1: preflight, then every eligible node prepared by the playbooks over the same connection.

One remote script per host (gpuk8s/playbook/script.py) runs every step that applies to it, holding the
host's lock. A host that fails preflight is not touched; a host that fails a step stops at that step
and the others go on; a re-run skips every step whose check passes.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import dataclass, field
from typing import Any

from gpuk8s.bundle.manifest import Manifest
from gpuk8s.gpuplan import is_gpu_node
from gpuk8s.inventory.model import Host, Inventory
from gpuk8s.lines import lines_that_matter
from gpuk8s.playbook.model import load_playbook
from gpuk8s.playbook.render import RenderedStep, context, render_playbook
from gpuk8s.playbook.script import StepOutcome, build_script, parse_output, stdin_launcher
from gpuk8s.preflight.result import CheckResult
from gpuk8s.preflight.runner import HostReport, run_preflight
from gpuk8s.remote import RemoteError, Session, for_each_host
from gpuk8s.text import ascii_int

log = logging.getLogger("gpuk8s.install")

# Preflight findings that the playbooks themselves fix: they never keep a host from being prepared.
FIXED_BY_INSTALL = frozenset({
    "runtime.active", "runtime.cri-plugin", "runtime.cgroup-driver", "toolkit.installed", "toolkit.default-runtime",
    "toolkit.dropin-path",
    "k8s.swap", "k8s.modules", "k8s.sysctl", "k8s.tools",
})


def playbooks_for(inv: Inventory) -> list[str]:
    # Docker: Kubernetes >= 1.24 reaches it only through cri-dockerd (playbooks/cri-dockerd.yaml)
    # the NVIDIA driver first, where any node has gpuk8s manage it (playbooks/nvidia-driver.yaml)
    driver = ["nvidia-driver"] if any(h.gpu.driver.manage for h in inv.hosts) else []
    # the RDMA user space where a GPU node sets fabric: (playbooks/rdma.yaml)
    rdma = ["rdma"] if any(h.gpu.fabric.enabled and is_gpu_node(h) for h in inv.hosts) else []
    return [*driver, "kubernetes-prerequisites", *rdma, "nvidia-container-toolkit", inv.cluster.container_runtime,
            *(["cri-dockerd"] if inv.cluster.container_runtime == "docker" else [])]


# lines of a changed step's output that are shown (playbooks/containerd.yaml: dated copies, a reused apt source)
NOTE_PREFIXES = ("kept the previous ", "using the existing source ")


@dataclass
class StepRun:
    step: RenderedStep
    outcome: StepOutcome

    @property
    def notes(self) -> list[str]:
        """What a changed step says the user should know: a file kept beside its replacement, a source used."""
        if self.outcome.status != "changed":
            return []
        return [ln.strip()[:300] for ln in self.outcome.output.splitlines() if ln.startswith(NOTE_PREFIXES)][:5]

    def to_json(self, with_commands: bool) -> dict[str, Any]:
        d: dict[str, Any] = {"playbook": self.step.playbook, "name": self.step.name, "title": self.step.title,
                             "status": self.outcome.status, "exit_status": self.outcome.exit_status,
                             "changes": list(self.step.changes)}
        if self.outcome.status in ("failed", "not-converged"):
            d["output"] = lines_that_matter(self.outcome.output, 20)
        if self.notes:
            d["notes"] = self.notes
        if with_commands and self.outcome.status == "would-change":
            d["commands"] = self.step.run
            if self.step.file_path:
                d["file"] = {"path": self.step.file_path, "content": self.step.file_content}
        return d


@dataclass
class HostRun:
    host: Host
    status: str = "pending"  # done | failed | blocked | unreachable | busy
    steps: list[StepRun] = field(default_factory=list)
    message: str = ""
    remedy: str = ""
    lock_note: str = ""
    seconds: float = 0.0
    progress: tuple[int, int, str] = (0, 0, "")  # steps reported so far, of how many, the next step's name

    def count(self, status: str) -> int:
        return sum(1 for s in self.steps if s.outcome.status == status)

    @property
    def failed_step(self) -> StepRun | None:
        return next((s for s in self.steps if s.outcome.status in ("failed", "not-converged")), None)

    def to_json(self, dry_run: bool) -> dict[str, Any]:
        return {"name": self.host.name, "address": self.host.address, "status": self.status,
                "message": self.message, "remedy": self.remedy, "lock": self.lock_note,
                "changed": self.count("changed"), "unchanged": self.count("unchanged"),
                "would_change": self.count("would-change"), "seconds": round(self.seconds, 2),
                "steps": [s.to_json(dry_run) for s in self.steps]}


@dataclass
class PrepareReport:
    hosts: list[HostRun]
    dry_run: bool
    seconds: float
    preflight: list[HostReport]

    @property
    def ok(self) -> bool:
        return all(h.status == "done" for h in self.hosts)

    def to_json(self) -> dict[str, Any]:
        return {"dry_run": self.dry_run,
                "hosts": [h.to_json(self.dry_run) for h in self.hosts],
                "summary": {"ok": self.ok, "hosts": len(self.hosts), "seconds": round(self.seconds, 2),
                            **{s: sum(1 for h in self.hosts if h.status == s)
                               for s in ("done", "failed", "blocked", "unreachable", "busy")},
                            "steps_changed": sum(h.count("changed") for h in self.hosts)}}


@dataclass(frozen=True)
class Event:
    """Live progress: a host finished preflight, or a step finished, or the host is done."""

    host: str
    kind: str  # 'preflight' | 'step' | 'host'
    index: int = 0
    total: int = 0
    step: str = ""
    status: str = ""


# Preflight findings that the health phase judges itself (as health.gpu-count) where it runs on the host: its policy
# (quarantine, skip, fail; docs/health.md) decides what a GPU missing does, not preflight
JUDGED_BY_HEALTH = frozenset({"gpu.count"})


def blocking_checks(checks: list[CheckResult], health: bool = False) -> list[CheckResult]:
    """The failed preflight checks that keep a host from being prepared: every failure except those the
    playbooks fix themselves (FIXED_BY_INSTALL) and, where the health phase judges the host (`health`), those it
    judges (JUDGED_BY_HEALTH)."""
    fine = FIXED_BY_INSTALL | JUDGED_BY_HEALTH if health else FIXED_BY_INSTALL
    return [c for c in checks if c.status == "fail" and c.id not in fine]


def owner() -> str:
    return f"gpuk8s on {socket.gethostname()} (pid {os.getpid()})"


def prepare(inv: Inventory, *, concurrency: int, ignore: set[str], sudo_passwords: Mapping[str, str],
            dry_run: bool = False, measure_network: bool = False,
            on_event: Callable[[Event], None] | None = None,
            sessions: MutableMapping[str, Session] | None = None,
            wanted: Callable[[RenderedStep], bool] | None = None,
            extra: Callable[[Host], str] | None = None,
            lenient: Callable[[Host], bool] | None = None, bundle: Manifest | None = None,
            before: Callable[[Host, Session], None] | None = None) -> PrepareReport:
    """Preflight, then the playbooks on every host that passed. With `sessions`, connections stay open
    for the caller (install part 2 goes on over them) and the caller closes them. `wanted`: the steps to run
    (upgrade leaves the Kubernetes packages to its node-by-node phases); default all. `extra`: sections preflight
    runs after its probe on a host (run_preflight), read into its HostReport.health. `before`: what runs on a host
    that passed preflight, before its steps (a run from a bundle points its sources at the serving host; also
    where the steps are only checked, as with --skip-phases prepare: the later phases pull from the bundle too).
    Callers give it for a run only, never for a plan."""
    start = time.monotonic()
    own = sessions is None
    sessions = {} if sessions is None else sessions  # the run's (Context.sessions): connections stay open
    emit = on_event or (lambda e: None)
    runs = {h.name: HostRun(h) for h in inv.hosts}
    playbooks = [load_playbook(n) for n in playbooks_for(inv)]

    def blocking(rep: HostReport) -> list[CheckResult]:
        return blocking_checks(rep.checks, health=bool(lenient and lenient(rep.host)))

    def after_preflight(rep: HostReport) -> None:
        emit(Event(rep.host.name, "preflight", status="ok" if not blocking(rep) else "blocked"))

    try:
        pre = run_preflight(inv, concurrency=concurrency, ignore=ignore, sudo_passwords=sudo_passwords,
                            measure_network=measure_network, on_host=after_preflight, keep_sessions=sessions,
                            extra=extra, bundle=bundle)
        eligible = []
        for rep in pre.hosts:
            run = runs[rep.host.name]
            if not rep.reachable or rep.facts is None or rep.host.name not in sessions:
                run.status = "unreachable"
                c = rep.checks[0] if rep.checks else None
                run.message = c.message if c else "not reachable"
                run.remedy = c.remedy if c else ""
            elif blocking(rep):
                run.status = "blocked"
                bad = blocking(rep)
                run.message = "preflight failed: " + "; ".join(f"{c.id}: {c.message}" for c in bad)
                run.remedy = bad[0].remedy + f" (or re-run with --ignore {bad[0].id} to prepare it anyway)"
            else:
                eligible.append(rep)
        facts = {rep.host.name: rep.facts for rep in eligible}

        def one(host: Host) -> HostRun:
            run = runs[host.name]
            t0 = time.monotonic()
            f = facts[host.name]
            assert f is not None
            ctx = context(inv, host, f)
            steps = [s for pb in playbooks for s in render_playbook(pb, ctx) if wanted is None or wanted(s)]
            if before is not None:
                before(host, sessions[host.name])
            run_steps(sessions[host.name], run, steps, dry_run, emit)
            run.seconds = time.monotonic() - t0
            emit(Event(host.name, "host", status=run.status))
            return run

        results = for_each_host([r.host for r in eligible], one, concurrency)
        for name, res in results.items():
            if isinstance(res, BaseException):
                run = runs[name]
                run.status = "failed"
                if isinstance(res, RemoteError):
                    run.message, run.remedy = f"{res.kind}: {res.message}", res.remedy
                    done, total, nxt = run.progress
                    if total:
                        run.message += (f" ({done} of {total} steps had finished; it was at step {nxt})"
                                        if done < total else f" (all {total} steps had finished)")
                else:
                    log.exception("%s: unexpected error", name, exc_info=res)
                    run.message = f"{type(res).__name__}: {res}"
                emit(Event(name, "host", status="failed"))
    finally:
        if own:
            for s in sessions.values():
                s.close()
    return PrepareReport([runs[h.name] for h in inv.hosts], dry_run, time.monotonic() - start, pre.hosts)


def run_steps(session: Session, run: HostRun, steps: list[RenderedStep], dry_run: bool,
              emit: Callable[[Event], None]) -> None:
    """Run these rendered playbook steps on one host as one remote script under the host's lock (with `dry_run`,
    only their checks), emitting an Event per finished step; each step's outcome and the host's status (done,
    failed, busy), message and remedy are recorded in `run`."""
    name = session.host.name
    total = len(steps)

    run.progress = (0, total, steps[0].name if steps else "")

    def on_line(line: str) -> None:
        if line.startswith("@@gpuk8s-step "):
            parts = line.split()
            i = ascii_int(parts[1]) if len(parts) == 4 else None
            if i is not None and i < total:
                run.progress = (i + 1, total, steps[i + 1].name if i + 1 < total else "")
                emit(Event(name, "step", i + 1, total, steps[i].name, parts[2]))

    script = build_script(steps, owner=owner(), dry_run=dry_run)
    what = "checks of the playbooks (dry run, read-only)" if dry_run else "the playbooks"
    data = script.encode()
    res = session.run(stdin_launcher(len(data)), sudo=True, stdin=data, display=f"gpuk8s: {what}, {total} steps",
                      on_line=on_line)
    out = parse_output(res.stdout)
    for i, step in enumerate(steps):
        oc = out.steps.get(i, StepOutcome(i, "not-run"))
        run.steps.append(StepRun(step, oc))
        for note in run.steps[-1].notes:
            log.warning("%s: %s: %s", name, step.name, note)
        log.debug("%s: step %s/%s -> %s (exit %d)%s", name, step.playbook, step.name, oc.status, oc.exit_status,
                  "".join(f"\n    {ln}" for ln in oc.output.splitlines()))
    if out.lock.startswith("stale"):
        run.lock_note = f"took over a stale lock left by {out.lock[6:]}"
        log.warning("%s: %s", name, run.lock_note)
    if out.lock.startswith("busy"):
        run.status = "busy"
        run.message = f"another gpuk8s run is preparing this host: {out.lock[5:] or 'owner unknown'}"
        run.remedy = "wait for it to finish, then re-run"
        return
    failed = run.failed_step
    if failed is not None:
        run.status = "failed"
        oc = failed.outcome
        if oc.status == "not-converged":
            run.message = f"step {failed.step.name}: its commands succeeded but its check still fails"
        else:
            run.message = f"step {failed.step.name} failed with exit status {oc.exit_status}"
        lines = lines_that_matter(oc.output)
        if lines:
            run.message += ": " + " | ".join(lines)
        run.remedy = "fix the cause on the host, then re-run: finished steps are skipped"
        return
    if not out.finished:
        run.status = "failed"
        detail = out.fatal or (res.stderr.strip().splitlines() or [f"exit status {res.exit_status}"])[-1]
        run.message = f"the playbook script stopped early: {detail}"
        run.remedy = "re-run; see the log file for the full output"
        return
    run.status = "done"
