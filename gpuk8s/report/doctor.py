"""`gpuk8s doctor` as people and scripts read it: a doctor Diagnosis (gpuk8s/doctor/diagnose.py) as a table of
findings by subject (pod or node), a line when nothing is wrong, or JSON with the fixes applied."""

from __future__ import annotations

from typing import Any

from gpuk8s import ui
from gpuk8s.doctor.diagnose import Diagnosis
from gpuk8s.options import Output
from gpuk8s.report import findings


def render(d: Diagnosis, output: Output, fixes: list[dict[str, Any]]) -> None:
    if output == Output.json:
        ui.emit_json(d.to_json(fixes))
    elif d.findings:
        rows, styles = findings.rows(d.findings, "subject")
        # the subject column names the kind too (pod/NS/NAME, node/NAME): a doctor run mixes pods and nodes
        for r, f in zip(rows, d.findings, strict=True):
            r[0] = str(f.subject) if f.subject is not None else ""
        ui.table("gpuk8s doctor", ["subject", *findings.COLUMNS], rows, styles)
    else:
        what = (f"{len(d.pods)} GPU pod(s), {len(d.nodes)} GPU node(s) looked at" if (d.pods or d.nodes)
                else "no Pending or failing GPU pod, no GPU node short of its plan")
        ui.say(ui.console(), f"doctor: nothing wrong found ({what})")
