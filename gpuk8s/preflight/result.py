"""Check results: preflight's name for a finding (gpuk8s/findings.py), kept for its many callers.

A check result IS a `Finding`: a stable id, a severity, a status, what was found and what to do (and,
where given, the subject and the evidence). The ids and their severities are registered once, in
`gpuk8s.findings.FINDINGS`; `CHECKS` is the part of that registry that preflight reports, which is what
--ignore accepts.
"""

from __future__ import annotations

from gpuk8s.findings import Finding, Severity, Status, apply_ignores, failed, ids, passed, skipped

CheckResult = Finding

# Every preflight check id with its severity, in registry order. Ids are stable: users pass them to
# --ignore and scripts read them from --output json.
CHECKS: dict[str, Severity] = ids("preflight")

__all__ = ["CHECKS", "CheckResult", "Severity", "Status", "apply_ignores", "failed", "passed", "skipped"]
