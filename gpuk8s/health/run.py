"""`gpuk8s health`'s run: one round trip per host (the fact probe and the health sections, as root), then the
quick level's judgement (gpuk8s/health/checks.py) per host.

The health sections, after the probe's and in its framing (gpuk8s/facts/probe.sh: `quick` bounds each at 256 KiB):
`nvidia-smi -q` (every GPU's ECC, remapping, PCIe link, clock reasons, fabric), `nvidia-smi nvlink -s`, and the
kernel's NVRM lines since boot (journalctl -k -b 0 where the journal has the kernel's messages, else dmesg; only
the lines that name an Xid or a GPU off the bus, the first 4,000). nvidia-smi goes through the probe's `smi`,
which is not called again once one nvidia-smi has hung.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from gpuk8s.facts.dcgm import MAX_BYTES, parse_diag
from gpuk8s.facts.health import KERNEL_SECTION, RDMA_SECTION, SMI_SECTIONS, HealthFacts, read_health
from gpuk8s.facts.model import HostFacts
from gpuk8s.findings import Finding, counts, failed
from gpuk8s.gpuplan import is_gpu_node
from gpuk8s.health.checks import DCGM_RUNS, judge, judge_dcgm, judge_rdma
from gpuk8s.inventory.model import Host
from gpuk8s.preflight.runner import probe
from gpuk8s.remote import RemoteError, Session, for_each_host
from gpuk8s.text import clean

EXTRA = SMI_SECTIONS + KERNEL_SECTION
# The standard and long levels (checks.DCGM_RUNS): DCGM's diagnostic after the quick level, one more round trip.
# `dcgmi diag -r 2` runs a few minutes, `-r 3` up to an hour on 8 GPUs: their own timeouts
DCGM_TIMEOUT = {"standard": 1800, "long": 7200}
NOT_INSTALLED = 127  # the exit status of the command below without dcgmi


def sections(level: str) -> str:
    """The health sections a level reads with the probe: the fabric level's RDMA counters beside the quick ones."""
    return EXTRA + (RDMA_SECTION if level == "fabric" else "")


def judge_level(host: Host, facts: HostFacts, h: HealthFacts, level: str) -> list[Finding]:
    """The quick level's findings, and the fabric level's where it is the level."""
    return judge(host, facts, h) + ([judge_rdma(host, facts, h)] if level == "fabric" else [])


def dcgm_command(level: str) -> str:
    return (f"command -v dcgmi >/dev/null 2>&1 || {{ echo 'dcgmi: not installed'; exit {NOT_INSTALLED}; }}; "
            f"dcgmi diag -r {DCGM_RUNS[level]} -j")


@dataclass
class HostHealth:
    host: Host
    reachable: bool = False
    facts: HostFacts | None = None
    health: HealthFacts | None = None
    findings: list[Finding] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.reachable and all(f.ok for f in self.findings)

    def to_json(self) -> dict[str, Any]:
        h = self.health
        return {"name": self.host.name, "address": self.host.address, "reachable": self.reachable,
                "healthy": self.ok, "seconds": round(self.seconds, 2),
                "gpus": [{"bus": g.bus, "name": g.name, "uncorrected_volatile": g.uncorrected_volatile,
                          "remap_pending": g.remap_pending, "remap_failed": g.remap_failed,
                          "retired_pending": g.retired_pending, "pcie_width": g.width_current,
                          "pcie_width_max": g.width_max, "slowdowns": list(g.slowdowns),
                          "fabric": g.fabric_state} for g in (h.gpus if h else ())],
                "xids": [{"bus": e.bus, "xid": e.xid, "instance": e.instance, "text": e.text}
                         for e in (h.kernel.xids if h else ())],
                "findings": [f.to_json() for f in self.findings], "summary": counts(self.findings)}


@dataclass
class HealthReport:
    hosts: list[HostHealth]
    level: str
    seconds: float

    @property
    def ok(self) -> bool:
        return all(h.ok for h in self.hosts)

    def to_json(self) -> dict[str, Any]:
        return {"level": self.level, "hosts": [h.to_json() for h in self.hosts],
                "summary": {"ok": self.ok, "hosts": len(self.hosts),
                            "unhealthy": sum(1 for h in self.hosts if not h.ok),
                            "seconds": round(self.seconds, 2)}}


def check_host(host: Host, sudo_password: str | None, level: str = "quick") -> HostHealth:
    with Session(host, sudo_password) as s:
        return check_session(s, level)


def check_session(session: Session, level: str = "quick") -> HostHealth:
    """The quick level over an open (or not yet opened) connection, one round trip; the standard and long levels
    add DCGM's diagnostic on a GPU host that can be checked at all, one more; the fabric level the RDMA ports' error
    counters, in the same round trip."""
    host = session.host
    out = HostHealth(host)
    t0 = time.monotonic()
    try:
        facts, checks, _, stdout = probe(session, extra=sections(level))
    except RemoteError as e:
        # a probe that came back unreadable (cut, nothing parseable) is not a host that cannot be reached
        out.reachable = e.kind == "probe"
        out.findings = [failed("facts.parse" if e.kind == "probe" else "ssh.reachable", e.message, e.remedy)]
        out.seconds = time.monotonic() - t0
        return out
    out.reachable = True
    out.facts = facts
    bad = [c for c in checks if c.status == "fail"]  # sudo: the probe ran unprivileged, its answers are partial
    out.health = read_health(stdout)
    out.findings = bad + judge_level(host, facts, out.health, level)
    if level in DCGM_RUNS and is_gpu_node(host) and facts.gpu.state == "ok":
        out.findings.append(dcgm(session, level))
    out.seconds = time.monotonic() - t0
    return out


def dcgm(session: Session, level: str) -> Finding:
    """Run DCGM's diagnostic of `level` as root and judge it (health.dcgm-diag)."""
    try:
        res = session.run(dcgm_command(level), sudo=True, timeout=DCGM_TIMEOUT[level],
                          display=f"dcgmi diag -r {DCGM_RUNS[level]} -j (DCGM's diagnostic, read-only)",
                          max_output=MAX_BYTES)
    except RemoteError as e:
        return failed("health.dcgm-diag", f"dcgmi diag -r {DCGM_RUNS[level]} did not finish: {e.message}", e.remedy)
    if res.exit_status == NOT_INSTALLED and "dcgmi: not installed" in res.stdout:
        return judge_dcgm(level, None)
    report = parse_diag(res.stdout)
    if not report.read and res.stderr.strip():
        report = replace(report, error=f"{report.error}; dcgmi: {clean(res.stderr.strip().splitlines()[-1])[:300]}")
    return judge_dcgm(level, report)


def run_health(hosts: list[Host], *, concurrency: int, sudo_passwords: dict[str, str],
               on_host: Callable[[HostHealth], None] | None = None, level: str = "quick") -> HealthReport:
    """The level's checks on every host, `concurrency` at a time; one host's failure never stops another."""
    t0 = time.monotonic()

    def one(h: Host) -> HostHealth:
        r = check_host(h, sudo_passwords.get(h.name), level)
        if on_host:
            on_host(r)
        return r

    results = for_each_host(hosts, one, concurrency)
    reports = []
    for h in hosts:
        r = results[h.name]
        if isinstance(r, BaseException):  # a bug: named, not a traceback, and the others are kept
            r = HostHealth(h, findings=[failed("facts.parse", f"gpuk8s failed on this host: {r!r}",
                                               "see the log file and report it")])
        reports.append(r)
    return HealthReport(reports, level, time.monotonic() - t0)
