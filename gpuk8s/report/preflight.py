"""Render a preflight report: a table of findings per host, the cluster checks, and the network matrix."""

from __future__ import annotations

from gpuk8s import ui
from gpuk8s.preflight.network import Link
from gpuk8s.preflight.runner import Report
from gpuk8s.report import findings


def render(report: Report, min_gbit: float, max_rtt_ms: float) -> None:
    for h in report.hosts:
        verdict = "FAIL" if h.failed else "ready"
        findings.table(f"{h.host.name} ({h.host.address}, {h.host.role}): {verdict}", h.checks)
    findings.table("cluster", report.cluster)
    if report.links:
        render_matrix(report.links, min_gbit, max_rtt_ms)
    s = report.to_json()["summary"]
    line = (f"{s['hosts']} host(s), {s['hosts_failed']} not ready; checks: {s['pass']} passed, {s['warn']} warnings, "
            f"{s['fail']} failed, {s['skip']} skipped; {s['seconds']:.1f} s")
    verdict = "READY" if report.ok else "NOT READY"
    ui.say(ui.console(), f"{verdict}: {line}", "bold green" if report.ok else "bold red")


def render_matrix(links: list[Link], min_gbit: float, max_rtt_ms: float) -> None:
    rows, styles = [], []
    for link in links:
        rtt = f"{link.rtt_ms:.2f} ms" if link.rtt_ms is not None else "-"
        bw = f"{link.gbit:.2f} Gbit/s" if link.gbit is not None else "-"
        bad = (link.rtt_ms is not None and link.rtt_ms > max_rtt_ms) or (link.gbit is not None and link.gbit < min_gbit)
        rows.append([f"control plane <-> {link.worker}", rtt, bw, link.note])
        styles.append("yellow" if bad else ("dim" if link.gbit is None and link.rtt_ms is None else "green"))
    ui.table(f"network (thresholds: RTT <= {max_rtt_ms:g} ms, >= {min_gbit:g} Gbit/s)",
             ["link", "RTT", "bandwidth", "note"], rows, styles)
