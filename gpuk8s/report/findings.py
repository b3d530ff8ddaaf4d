"""Findings (gpuk8s/findings.py) as people and scripts read them.

On a terminal: a rich table (check, status, detail), the detail being the message, then `-> remedy` and
the evidence, one `| line` each, for what warns or fails. Piped: the same table as tab-separated lines,
one finding per line. `-o json`: `to_json`. Cells go through `gpuk8s.ui.table`, which shows host text
literally (never markup), removes control characters and masks secrets.
"""

from __future__ import annotations

from collections.abc import Sequence

from gpuk8s import ui
from gpuk8s.findings import Finding, to_json
from gpuk8s.options import Output

STYLE = {"pass": "green", "warn": "yellow", "fail": "bold red", "skip": "dim"}
MARK = {"pass": "ok", "warn": "WARN", "fail": "FAIL", "skip": "skip"}
COLUMNS = ["check", "status", "detail"]
MAX_EVIDENCE = 8  # lines of evidence shown in a table cell; -o json carries all


def detail(f: Finding, max_evidence: int = MAX_EVIDENCE) -> str:
    """The detail cell: the message; for a warning or failure also the remedy and the evidence."""
    lines = [f.message]
    if f.status in ("warn", "fail"):
        if f.remedy:
            lines.append(f"  -> {f.remedy}")
        lines += [f"  | {e}" for e in f.evidence[:max_evidence]]
        if len(f.evidence) > max_evidence:
            lines.append(f"  | ... {len(f.evidence) - max_evidence} more line(s) (-o json shows all)")
    return "\n".join(lines)


def rows(findings: Sequence[Finding], subject: str | None = None) -> tuple[list[list[str]], list[str]]:
    """Table rows and their styles; with `subject` (its column's title), the subject's name comes first."""
    out, styles = [], []
    for f in findings:
        row = [f.id, MARK[f.status], detail(f)]
        if subject is not None:
            row.insert(0, f.subject.name if f.subject is not None else "")
        out.append(row)
        styles.append(STYLE[f.status])
    return out, styles


def table(title: str, findings: Sequence[Finding], subject: str | None = None) -> None:
    """A table of findings: rich on a terminal, tab-separated lines when piped (see gpuk8s.ui.table)."""
    r, styles = rows(findings, subject)
    ui.table(title, ([subject] if subject is not None else []) + COLUMNS, r, styles)


def render(title: str, findings: Sequence[Finding], output: Output = Output.table,
           subject: str | None = None) -> None:
    """The findings in the chosen output: JSON on stdout, else the table."""
    if output == Output.json:
        ui.emit_json(to_json(findings))
    else:
        table(title, findings, subject)
