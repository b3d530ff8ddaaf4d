"""Render a `gpuk8s health` report: a table of findings per host, then the verdict."""

from __future__ import annotations

from gpuk8s import ui
from gpuk8s.health.run import HealthReport
from gpuk8s.report import findings


def render(report: HealthReport) -> None:
    for h in report.hosts:
        verdict = "healthy" if h.ok else ("UNREACHABLE" if not h.reachable else "UNHEALTHY")
        findings.table(f"{h.host.name} ({h.host.address}): {verdict}", h.findings)
    s = report.to_json()["summary"]
    line = f"{s['hosts']} host(s), {s['unhealthy']} unhealthy or unreachable; {s['seconds']:.1f} s"
    ui.say(ui.console(), ("HEALTHY: " if report.ok else "UNHEALTHY: ") + line,
           "bold green" if report.ok else "bold red")
