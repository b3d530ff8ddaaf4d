"""Preflight orchestration: connect to every host (bounded), one probe run per host, checks, network."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from gpuk8s.bundle.coverage import host_gaps
from gpuk8s.bundle.manifest import Manifest
from gpuk8s.facts.health import HealthFacts, read_health
from gpuk8s.facts.model import HostFacts
from gpuk8s.facts.parse import ParseError, parse_probe
from gpuk8s.inventory.model import Host, Inventory
from gpuk8s.preflight import network
from gpuk8s.preflight.cluster_checks import check_cluster
from gpuk8s.preflight.fabric_checks import fabric_consistency
from gpuk8s.preflight.host_checks import check_host, sources_check
from gpuk8s.preflight.result import CheckResult, apply_ignores, failed, passed, skipped
from gpuk8s.preflight.sources import SourcePlan
from gpuk8s.remote import RemoteError, Session, for_each_host, in_one_piece
from gpuk8s.ui import LazyList

log = logging.getLogger("gpuk8s.preflight")

PROBE = resources.files("gpuk8s.facts").joinpath("probe.sh").read_text()
# The probe caps each of its ~31 sections at 256 KiB (probe.sh), so a real host never prints more than this;
# more is a host that does not run the probe as written, and a cut output would read as missing sections
PROBE_MAX_OUTPUT = 8 << 20


@dataclass
class HostReport:
    host: Host
    reachable: bool = False
    facts: HostFacts | None = None
    checks: list[CheckResult] = field(default_factory=list)
    seconds: float = 0.0
    local_time: float | None = None
    # the health sections' reading, where run_preflight was given `extra` for this host (install's health phase)
    health: HealthFacts | None = None

    @property
    def failed(self) -> bool:
        return any(c.status == "fail" for c in self.checks)


@dataclass
class Report:
    hosts: list[HostReport]
    cluster: list[CheckResult]
    links: list[network.Link]
    seconds: float

    @property
    def ok(self) -> bool:
        return not any(h.failed for h in self.hosts) and not any(c.status == "fail" for c in self.cluster)

    def json_fields(self) -> list[tuple[str, Any]]:
        """The report's JSON object as (key, value), the hosts as a LazyList: -o json writes each host's object and
        drops it (ui.emit_json_stream), so that 512 hosts' report is never in memory whole."""
        all_checks = [c for h in self.hosts for c in h.checks] + self.cluster
        counts = {s: sum(1 for c in all_checks if c.status == s) for s in ("pass", "warn", "fail", "skip")}
        return [
            ("hosts", LazyList({
                "name": h.host.name,
                "address": h.host.address,
                "role": h.host.role,
                "reachable": h.reachable,
                "facts": h.facts.to_json() if h.facts else {},
                "checks": [c.to_json() for c in h.checks],
            } for h in self.hosts)),
            ("cluster", {
                "checks": [c.to_json() for c in self.cluster],
                "links": [{"worker": link.worker, "rtt_ms": link.rtt_ms, "gbit_per_s": link.gbit,
                           "note": link.note} for link in self.links],
            }),
            ("summary", {
                "ok": self.ok,
                "hosts": len(self.hosts),
                "hosts_failed": sum(1 for h in self.hosts if h.failed),
                "seconds": round(self.seconds, 2),
                **counts,
            }),
        ]

    def to_json(self) -> dict[str, Any]:
        return {k: list(v.items) if isinstance(v, LazyList) else v for k, v in self.json_fields()}


def gather(session: Session, prelude: str = "") -> tuple[HostFacts, list[CheckResult], float]:
    """Connect, run the probe once as root (once more unprivileged if sudo fails); facts and sudo result.
    `prelude`: shell assignments in front of the probe (the sources it checks: SourcePlan.prelude)."""
    facts, checks, now, _ = probe(session, prelude)
    return facts, checks, now


def probe(session: Session, prelude: str = "", extra: str = "") -> tuple[HostFacts, list[CheckResult], float, str]:
    """gather's work, with `extra` sections after the probe's (gpuk8s health's, in the same framing): the facts,
    the SSH and sudo results, when the facts were read, and the probe's whole output (the extra sections' text)."""
    session.connect()
    checks = [passed("ssh.reachable", f"{session.settings.user}@{session.host.address}:{session.settings.port}")]
    # in one piece: the probe's ~100 writes as one SSH packet stream at its end, not a packet each (remote.py)
    script = in_one_piece(prelude + PROBE + extra)
    res = session.run(script, sudo=True, timeout=120, display="gpuk8s fact probe (read-only)",
                      max_output=PROBE_MAX_OUTPUT)
    now = time.time()
    if "@@gpuk8s-begin" not in res.stdout:
        checks.append(failed("ssh.sudo", _sudo_problem(res.stderr, session), _sudo_remedy(res.stderr, session)))
        res = session.run(script, timeout=120, display="gpuk8s fact probe (read-only, without sudo)",
                          max_output=PROBE_MAX_OUTPUT)
        now = time.time()
    else:
        checks.append(passed("ssh.sudo", "root" if session.is_root else f"sudo ({session.settings.sudo.mode})"))
    if res.truncated:
        raise RemoteError("probe", f"the fact probe printed {res.stdout_bytes} bytes, more than the "
                          f"{PROBE_MAX_OUTPUT >> 20} MiB its sections can add up to: not read",
                          "check what the host runs as sh and sudo; run the probe by hand with --verbose")
    try:
        facts = parse_probe(res.stdout)
    except ParseError as e:
        raise RemoteError("probe", f"the fact probe printed nothing usable: {e}; stderr: {res.stderr[:300]}",
                          "run it by hand with --verbose and see the log") from None
    return facts, checks, now, res.stdout


def _sudo_problem(stderr: str, s: Session) -> str:
    text = stderr.strip().splitlines()
    first = text[0] if text else "no output"
    if "password is required" in stderr:
        return f"sudo asks {s.settings.user} for a password (sudo.mode is nopasswd): {first}"
    if "incorrect password" in stderr or "Sorry, try again" in stderr:
        return f"sudo rejected the password given for {s.settings.user}"
    if "not in the sudoers" in stderr or "not allowed" in stderr:
        return f"{s.settings.user} may not use sudo: {first}"
    return f"sudo failed: {first}"


def _sudo_remedy(stderr: str, s: Session) -> str:
    if "password is required" in stderr:
        return (f"set ssh.sudo.mode: password and export {s.settings.sudo.password_env}, "
                f"or allow NOPASSWD for {s.settings.user} in /etc/sudoers.d/")
    if "incorrect password" in stderr or "Sorry, try again" in stderr:
        return f"export the right password in {s.settings.sudo.password_env}"
    return f"give {s.settings.user} sudo rights on the host, or connect as root"


def bundle_check(m: Manifest, inv: Inventory, host: Host, facts: HostFacts) -> CheckResult:
    """bundle.coverage: the bundle the run installs from serves this host (gpuk8s/bundle/coverage.py)."""
    gaps = host_gaps(m, inv, host, facts)
    if gaps:
        return failed("bundle.coverage", "; ".join(g.message for g in gaps),
                      "build a bundle that covers it (gpuk8s bundle create -i INVENTORY, with --target for hosts "
                      "that machine cannot reach), or leave the host out of this run")
    return passed("bundle.coverage", f"the bundle serves {host.name} (Kubernetes {m.kubernetes})")


def run_preflight(inv: Inventory, *, concurrency: int, ignore: set[str], sudo_passwords: Mapping[str, str],
                  network_seconds: float | None = None, measure_network: bool = True,
                  on_host: Callable[[HostReport], None] | None = None,
                  keep_sessions: MutableMapping[str, Session] | None = None,
                  extra: Callable[[Host], str] | None = None, bundle: Manifest | None = None) -> Report:
    """Preflight of every host. With `keep_sessions`, the open connections are handed over there
    (the caller closes them) so that install goes on over the same connection. `extra`: sections to run after the
    probe's on a host, in the same round trip (install's GPU health: gpuk8s/health/run.py EXTRA), read into
    HostReport.health. `bundle`: the bundle the run installs from (install --bundle): each host it does not cover
    fails bundle.coverage."""
    start = time.monotonic()
    reports = {h.name: HostReport(h) for h in inv.hosts}
    sessions: MutableMapping[str, Session] = {} if keep_sessions is None else keep_sessions
    # A host's connection is kept past its facts only when something later uses it: the caller
    # (keep_sessions) or the network measurement (a control plane and the workers). Otherwise it is closed
    # as soon as the facts are in, so that a large run does not hold every transport (and its reader
    # thread) open to the end.
    network_later = measure_network and bool(inv.control_planes) and bool(inv.workers)
    keep_all = keep_sessions is not None or network_later
    # what depends on the inventory only is decided once per run, not per host (the sources render every manifest)
    plan = SourcePlan(inv)

    def one(host: Host) -> HostReport:
        rep = reports[host.name]
        t0 = time.monotonic()
        # a connection the caller opened already (the cluster lock's) is used, not a second one
        mine = host.name not in sessions  # the caller's (the cluster lock's) connection is the caller's to close
        s = sessions.get(host.name) or Session(host, sudo_passwords.get(host.name))
        stage = "gathering its facts"
        checks: list[CheckResult] = []
        try:
            more = extra(host) if extra is not None else ""
            facts, checks, now, stdout = probe(s, plan.prelude(host), more)
            if more:
                rep.health = read_health(stdout)
            del stdout  # ~100 KB a host: never kept past its reading (512 hosts' outputs would be 50 MB)
            if keep_all:
                sessions[host.name] = s
            else:
                s.close()
            rep.reachable = True
            rep.facts = facts
            rep.local_time = now
            stage = "checking its facts"
            rep.checks = checks + check_host(host, facts, inv.cluster, install=inv.install) + [
                sources_check(plan.for_host(host), facts)]
            if bundle is not None:
                rep.checks.append(bundle_check(bundle, inv, host, facts))
        except RemoteError as e:
            if mine:
                s.close()
            rep.checks = [failed("ssh.reachable", f"{e.kind}: {e.message}", e.remedy)]
        except Exception as e:
            # A bug (a parser or a check that raised): this host failed, it must never look ready. The
            # traceback goes to the log file (and to the terminal with --verbose); the check says what failed.
            log.warning("%s: gpuk8s failed while %s", host.name, stage, exc_info=True)
            if host.name not in sessions:
                s.close()
            rep.checks = checks + [failed("facts.parse", f"gpuk8s failed while {stage}: {type(e).__name__}: "
                                          f"{str(e)[:300]}",
                                          "report this as a gpuk8s bug with the log file; re-run with --verbose")]
        rep.seconds = time.monotonic() - t0
        rep.checks = apply_ignores(rep.checks, ignore)
        if on_host:
            on_host(rep)
        return rep

    try:
        for_each_host(inv.hosts, one, concurrency)
        facts = {n: r.facts for n, r in reports.items() if r.facts is not None}
        unreachable = [n for n, r in reports.items() if not r.reachable]
        local_times = {n: r.local_time for n, r in reports.items() if r.local_time is not None}
        cluster = check_cluster(facts, unreachable, local_times, inv.preflight.max_clock_skew_s)
        cluster += fabric_consistency(list(inv.hosts), facts)
        links: list[network.Link] = []
        cps = [h for h in inv.control_planes if h.name in sessions]
        workers = {h.name: sessions[h.name] for h in inv.workers if h.name in sessions}
        if measure_network and cps and workers:
            secs = inv.preflight.network_test_seconds if network_seconds is None else network_seconds
            links = network.measure(sessions[cps[0].name], workers, secs)
            cluster += network.link_checks(links, inv.preflight.max_rtt_ms, inv.preflight.min_bandwidth_gbit)
        elif measure_network and (workers or any(reports[h.name].reachable for h in inv.workers)):
            # (sessions holds no worker when none was kept: no control plane in the inventory)
            cluster.append(skipped("net.rtt", "no reachable control plane to measure from"))
        cluster = apply_ignores(cluster, ignore)
    finally:
        if keep_sessions is None:
            for s in sessions.values():
                s.close()
    ordered = [reports[h.name] for h in inv.hosts]
    return Report(ordered, cluster, links, time.monotonic() - start)
