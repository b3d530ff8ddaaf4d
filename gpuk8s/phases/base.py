"""What every phase is, what they share, and the runner (after k0sctl's phase/*.go).

A phase has a `name` (stable, in JSON), a `title` (in progress lines), `plan(ctx)` (read-only: what it
would change and why, with the exact remote commands and manifests, for `--dry-run`) and `run(ctx)`. There is
no cleanup hook: what a phase starts on a host finishes there and removes its own files, and what a run holds
(the cluster lock) is released by `Context.close` through `on_exit`. A flow (install, join, verify) is a list
of phases run over one Context: the inventory, the open SSH sessions, the facts gathered once, the GPU plan of
every node and the Kubernetes client.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

from gpuk8s.bundle.manifest import Manifest
from gpuk8s.bundle.site import BundleFile
from gpuk8s.errors import GpuK8sError
from gpuk8s.facts.health import HealthFacts
from gpuk8s.facts.model import HostFacts
from gpuk8s.findings import Finding
from gpuk8s.gpuplan import GPUPlan, plan_for, quarantine_taint
from gpuk8s.inventory.model import Host, Inventory, Taint
from gpuk8s.kube.client import ADMIN, KubeClient, SSHKubectl
from gpuk8s.kube.state import NodeCheck
from gpuk8s.remote import Session
from gpuk8s.text import clean

log = logging.getLogger("gpuk8s.phases")


class PhaseError(GpuK8sError):
    """A phase cannot go on; message and remedy are shown (masked, without control characters)."""

    kind = "phase"


@dataclass
class PhaseResult:
    name: str
    title: str
    status: str = "pending"  # changed | unchanged | passed | failed | skipped
    message: str = ""
    remedy: str = ""
    hosts: dict[str, str] = field(default_factory=dict)  # per host: what happened
    stop: bool = False  # a failure that stops the flow even where the phase is not fatal

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "title": self.title, "status": self.status, "message": self.message,
                "remedy": self.remedy, "hosts": self.hosts}


@dataclass(frozen=True)
class Change:
    """One thing a phase would do: in words, and exactly (the remote command, or the manifest applied)."""

    what: str
    host: str = ""  # where `commands` run ('' for changes made through the Kubernetes API)
    commands: str = ""
    manifest: str = ""
    stdin: str = ""  # what the command reads on stdin, shown with secrets as placeholders

    def to_json(self) -> dict[str, str]:
        return {k: v for k, v in self.__dict__.items() if v}


@dataclass
class PhasePlan:
    name: str
    title: str
    status: str  # would-change | unchanged | unknown
    reason: str = ""
    changes: list[Change] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "title": self.title, "status": self.status, "reason": self.reason,
                "changes": [c.to_json() for c in self.changes]}


@dataclass
class Options:
    kubeconfig_out: Path | None = None
    kubeconfig_force: bool = False
    kubeconfig_merge: bool = False
    test_pods: bool = True
    test_pod_timeout: float = 300
    fabric: bool = False  # verify --fabric: the fabric phase runs after verify (phases/fabric_verify.py)
    fabric_timeout: float = 900  # its pods, pulls of the nccl-tests image included
    fabric_quarantine: bool = False  # verify --fabric --quarantine: taint the nodes it fails, release those it passes
    only: list[Host] | None = None  # join: the hosts to join (else every host of the inventory)
    allow_reboot: bool = False  # the mig phase may reboot a host whose GPU reset was refused (--allow-reboot)
    reboot_timeout: float = 900  # how long a rebooted host may take to answer SSH again
    bundle: BundleFile | None = None  # --bundle: the verified bundle to serve for the run (phases/bundle.py)


@dataclass
class HostRecord:
    """Everything a run knows of one host, in one place: its connection, its facts and the GPU plan made from them,
    its sudo password, why it could not be reached, the GPU health read with its facts, the quarantine this run put
    it in, why a phase held it out of the cluster phases. None: not known (or not so)."""

    name: str
    session: Session | None = None
    facts: HostFacts | None = None
    plan: GPUPlan | None = None
    sudo_password: str | None = None
    unreachable: str | None = None
    health: tuple[HostFacts, HealthFacts] | None = None
    quarantine: str | None = None
    held: str | None = None


V = TypeVar("V")


class HostColumn(MutableMapping[str, V], Generic[V]):
    """One field of every HostRecord of a run, seen as a mapping host -> value (the hosts where it is set, in the
    inventory's order): `ctx.facts[name]`, `ctx.sessions.pop(name)` read and write the records themselves."""

    def __init__(self, ctx: Context, attr: str) -> None:
        self._ctx, self._attr = ctx, attr

    def __getitem__(self, name: str) -> V:
        r = self._ctx.records.get(name)
        value = getattr(r, self._attr) if r is not None else None
        if value is None:
            raise KeyError(name)
        return value

    def __setitem__(self, name: str, value: V) -> None:
        setattr(self._ctx.record(name), self._attr, value)

    def __delitem__(self, name: str) -> None:
        r = self._ctx.records.get(name)
        if r is None or getattr(r, self._attr) is None:
            raise KeyError(name)
        setattr(r, self._attr, None)

    def __iter__(self) -> Iterator[str]:
        return iter([n for n, r in list(self._ctx.records.items()) if getattr(r, self._attr) is not None])

    def __len__(self) -> int:
        return sum(1 for r in list(self._ctx.records.values()) if getattr(r, self._attr) is not None)

    def __repr__(self) -> str:
        return f"HostColumn({self._attr}: {dict(self)!r})"


def _column(attr: str) -> property:
    """A Context property that reads as HostColumn(attr) and, set to a mapping, replaces that field of every record
    (`ctx.facts = {...}`: the hosts it does not name have no facts any more)."""

    def get(ctx: Context) -> HostColumn[Any]:
        return HostColumn(ctx, attr)

    def put(ctx: Context, values: Mapping[str, Any]) -> None:
        values = dict(values)  # a column of this very context is read before it is cleared
        for r in ctx.records.values():
            setattr(r, attr, None)
        for name, value in values.items():
            setattr(ctx.record(name), attr, value)

    return property(get, put)


@dataclass
class Context:
    inv: Inventory
    # one record per host (HostRecord); the fields below marked "a column" are views of them, by host name
    records: dict[str, HostRecord] = field(default_factory=dict, init=False, repr=False)
    sessions: MutableMapping[str, Session] = field(default_factory=dict)  # a column: connections of hosts to work on
    facts: MutableMapping[str, HostFacts] = field(default_factory=dict)  # a column
    plans: MutableMapping[str, GPUPlan] = field(default_factory=dict)  # a column: made from facts (set_facts)
    options: Options = field(default_factory=Options)
    concurrency: int = 16
    emit: Callable[[str], None] = lambda line: None
    kube_client: KubeClient | None = None
    sudo_passwords: MutableMapping[str, str] = field(default_factory=dict)  # a column
    ignore: set[str] = field(default_factory=set)  # preflight checks that do not block a host
    nodes: list[NodeCheck] = field(default_factory=list)  # verify's verdicts
    kubeconfig: str = ""  # where the admin kubeconfig was written
    locked: bool = False  # this run holds the cluster lock
    # takes the cluster lock again on a new session to the first control plane (set by the lock phase): a reboot of
    # that host (phases/reboot.py) ends the connection the lock was held on
    relock: Callable[[Session], None] | None = None
    lock_lost: str = ""  # why the cluster lock could not be taken again after that reboot: the run stops
    unreachable: MutableMapping[str, str] = field(default_factory=dict)  # a column: why the flow could not connect
    # nodes whose device plugin config or sharing labels the gpu phase changed in this run, or whose plugin pod it
    # restarted: verify waits (up to the test pod timeout) for their allocatable to reflect the plan, as
    # config-manager applies a config, and a new plugin pod registers, a while later
    relabelled: set[str] = field(default_factory=set)
    # nodes whose device plugin pod this run restarted (the gpu phase, after prepare reconfigured their runtime):
    # doctor --fix restarts the others it was asked to (one decision, not a phase's message read back)
    plugin_restarted: set[str] = field(default_factory=set)
    on_exit: list[Callable[[], None]] = field(default_factory=list)
    # what must start again on a host that came back from a reboot (phases/reboot.py): the bundle's server; each
    # returns "" or why it could not (the run stops)
    after_reboot: list[Callable[[Host], str]] = field(default_factory=list)
    # what runs on a host before its playbook steps (phases/prepare.py, the upgrade's prepare), on its connection:
    # the bundle phase points its package sources at the serving host, once
    before_steps: list[Callable[[Host, Session], None]] = field(default_factory=list)
    initialized_cache: bool | None = None
    api_problem: str = ""  # admin.conf exists but the API server did not answer (initialized())
    prepare_report: Any = None  # install.prepare.PrepareReport, when the flow prepared hosts
    # the GPU health sections preflight read with a host's facts (inventory health.before_join): the facts object
    # they came with, so that the health phase reads a host again once a later phase re-read its facts (a driver
    # installed, a reboot)
    health: MutableMapping[str, tuple[HostFacts, HealthFacts]] = field(default_factory=dict)  # a column
    # nodes joined (or kept) with the quarantine taint by this run's health phase: node -> the failing finding's id
    quarantine: MutableMapping[str, str] = field(default_factory=dict)  # a column
    # hosts a phase left out of the cluster phases on purpose: host -> why (the health phase's skip)
    held: MutableMapping[str, str] = field(default_factory=dict)  # a column
    # the bundle this run serves (phases/bundle.py): preflight names each host it does not cover
    bundle: Manifest | None = None
    findings: list[Finding] = field(default_factory=list)  # per host, where a phase gives them (health): the report's

    def __post_init__(self) -> None:
        for h in self.inv.hosts:  # every host's record, in the inventory's order (whatever thread writes first)
            self.records.setdefault(h.name, HostRecord(h.name))

    def record(self, name: str) -> HostRecord:
        """The host's record (made on first use; every inventory host's first, in the inventory's order)."""
        r = self.records.get(name)
        if r is None:
            if not self.records:
                for h in self.inv.hosts:
                    self.records.setdefault(h.name, HostRecord(h.name))
            r = self.records.setdefault(name, HostRecord(name))
        return r

    def set_facts(self, facts: Mapping[str, HostFacts]) -> None:
        """The facts of the run's hosts, and every host's GPU plan made from them (gpuplan.plan_for; a host without
        facts is planned from the inventory alone): the one place a flow or a phase turns facts into plans."""
        self.facts = dict(facts)
        self.plans = {h.name: plan_for(h, facts.get(h.name)) for h in self.inv.hosts}

    def put_facts(self, name: str, facts: HostFacts) -> None:
        """One host's facts read again (a driver loaded, a reboot, a MIG change), and its GPU plan with them; safe
        from the threads of for_each_host, each on its own host."""
        self.facts[name] = facts
        host = next((h for h in self.inv.hosts if h.name == name), None)
        if host is not None:
            self.plans[name] = plan_for(host, facts)

    def close(self) -> None:
        """Release what the run holds (the cluster lock), then close every connection."""
        for fn in reversed(self.on_exit):
            fn()
        self.on_exit.clear()
        for s in list(self.sessions.values()):
            s.close()

    @property
    def cp(self) -> Host:
        return self.inv.control_planes[0]

    def cp_session(self) -> Session:
        s = self.sessions.get(self.cp.name)
        if s is None:
            raise PhaseError(f"the first control plane {self.cp.name} is not reachable",
                             "bring it back (see the preflight report), then re-run")
        return s

    @property
    def kube(self) -> KubeClient:
        """The cluster: the client given (--kubeconfig), else kubectl with admin.conf on the first control plane."""
        if self.kube_client is None:
            self.kube_client = SSHKubectl(self.cp_session())
        return self.kube_client

    def initialized(self) -> bool:
        """Whether the first control plane runs a control plane already (admin.conf exists).

        In the same round trip, whether its API server answers (/readyz): kubeadm writes admin.conf before it
        waits for the control plane, so a kubeadm init that failed half-way leaves one behind
        (`api_problem` then says what kubectl answered, and the init phase reports it instead of skipping).
        """
        if self.initialized_cache is None:
            res = self.cp_session().run(
                f"test -s {ADMIN} || exit 3; kubectl --kubeconfig {ADMIN} get --raw /readyz --request-timeout=10s",
                sudo=True)
            self.initialized_cache = res.exit_status != 3
            if self.initialized_cache and not res.ok:
                lines = (res.stderr or res.stdout).strip().splitlines()
                self.api_problem = clean(lines[-1] if lines else f"exit status {res.exit_status}")[:300]
        return self.initialized_cache

    def quarantine_taints(self, name: str) -> list[Taint]:
        """The taints a host registers with beyond kubeadm's: the quarantine, where this run's health phase put it
        in quarantine (kubeadm init's and join's nodeRegistration.taints)."""
        return [quarantine_taint(self.quarantine[name])] if name in self.quarantine else []

    def hosts_to_join(self) -> list[Host]:
        return [h for h in (self.options.only if self.options.only is not None else self.inv.hosts)
                if h.name != self.cp.name]


# the columns of the records: set after the dataclass is made, so that its __init__ (and dataclasses.replace) fill the
# records through them
for _attr, _name in (("session", "sessions"), ("facts", "facts"), ("plan", "plans"),
                     ("sudo_password", "sudo_passwords"), ("unreachable", "unreachable"), ("health", "health"),
                     ("quarantine", "quarantine"), ("held", "held")):
    setattr(Context, _name, _column(_attr))


class Phase:
    """A step of a flow. Subclasses set name and title and implement plan and run."""

    name = ""
    title = ""
    fatal = True  # a failure stops the phases after it

    def plan(self, ctx: Context) -> PhasePlan:
        raise NotImplementedError

    def run(self, ctx: Context) -> PhaseResult:
        raise NotImplementedError

    def result(self, status: str, message: str = "", remedy: str = "") -> PhaseResult:
        return PhaseResult(self.name, self.title, status, message, remedy)

    def planned(self, status: str, reason: str = "", changes: list[Change] | None = None) -> PhasePlan:
        return PhasePlan(self.name, self.title, status, reason, changes or [])


class PhaseSelectionError(GpuK8sError):
    """--skip-phases or --only-phase names a phase the command does not have, or one that cannot be left out."""

    kind = "phase-selection"


# Phases that no selection leaves out: the cluster lock keeps two gpuk8s runs from changing the cluster at once
ALWAYS = ("lock",)


class Skipped(Phase):
    """A phase left out by --skip-phases or --only-phase: shown in the plan and the report, run never."""

    def __init__(self, phase: Phase, why: str) -> None:
        self.name, self.title, self.fatal, self.why = phase.name, phase.title, False, why

    def plan(self, ctx: Context) -> PhasePlan:
        return self.planned("unchanged", f"skipped ({self.why})")

    def run(self, ctx: Context) -> PhaseResult:
        return self.result("skipped", f"skipped ({self.why})")


def select(phases: list[Phase], skip: Sequence[str] = (), only: str | None = None, command: str = "install",
           read_only: dict[str, Phase] | None = None) -> list[Phase]:
    """The phases with those that `skip` names (or all but `only` and the lock) replaced by Skipped, as kubeadm's
    --skip-phases does; `read_only`: a stand-in for a left-out phase whose inputs later phases need (install's
    prepare: the facts and connections are still read, nothing is applied). PhaseSelectionError, before anything
    runs, for an unknown name (the phases are listed) or a phase that cannot be left out."""
    names = [p.name for p in phases]
    if skip and only:
        raise PhaseSelectionError("--skip-phases and --only-phase together", "give one of them")
    unknown = [n for n in (*skip, *([only] if only else [])) if n not in names]
    if unknown:
        raise PhaseSelectionError(f"{command} has no phase {', '.join(unknown)}",
                                  f"its phases, in order: {', '.join(names)}")
    held = [n for n in skip if n in ALWAYS]
    if held:
        raise PhaseSelectionError(f"{', '.join(held)} cannot be skipped: the cluster lock keeps two gpuk8s runs "
                                  "from changing the cluster at once", "leave it out of --skip-phases")
    why = f"--only-phase {only}" if only else "--skip-phases"
    out: list[Phase] = []
    for p in phases:
        if p.name in ALWAYS or (p.name == only if only else p.name not in skip):
            out.append(p)
        else:
            out.append((read_only or {}).get(p.name) or Skipped(p, why))
    return out


def run_phases(phases: list[Phase], ctx: Context, results: list[PhaseResult]) -> bool:
    """Run the phases in order, each result appended to `results`; False when a fatal phase failed."""
    for p in phases:
        ctx.emit(f"==> Running phase: {p.title}")
        try:
            res = p.run(ctx)
        except GpuK8sError as e:
            res = p.result("failed", e.message, e.remedy)
        if ctx.lock_lost and res.status != "failed":
            res.status = "failed"
            res.message = "; ".join(x for x in (res.message, ctx.lock_lost) if x)
        log.info("phase %s: %s %s", p.name, res.status, res.message)
        results.append(res)
        if res.status == "failed" and (p.fatal or res.stop or ctx.lock_lost):
            # no phase runs without the cluster lock: another run may be changing the cluster now
            return False
    return True


def plan_phases(phases: list[Phase], ctx: Context) -> list[PhasePlan]:
    """Every phase's plan (read-only); a phase that cannot tell says why instead of failing the others."""
    out = []
    for p in phases:
        try:
            out.append(p.plan(ctx))
        except GpuK8sError as e:
            out.append(p.planned("unknown", f"{e.message} ({e.remedy})" if e.remedy else e.message))
    return out


def before_steps(ctx: Context) -> Callable[[Host, Session], None] | None:
    """What prepare runs on each host before its steps: every hook of ctx.before_steps (None: nothing)."""
    if not ctx.before_steps:
        return None
    hooks = list(ctx.before_steps)

    def each(h: Host, s: Session) -> None:
        for hook in hooks:
            hook(h, s)
    return each
