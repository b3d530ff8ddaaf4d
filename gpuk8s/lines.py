"""The lines of a command's output that a person should see first (a failed playbook step, kubectl, a host
command): pure, with no imports of gpuk8s, so that every layer may use it."""

from __future__ import annotations

import re

_MATTERS = re.compile(r"^(E:|Err:|W: Failed|curl: |gpg: |Job for |Error|error|ERROR|fatal|FATAL|Failed|failed|"
                      r"Could not|cannot|Unable|unable|\s*\[ERROR |"
                      r"No space|.*: No such file|.*Permission denied|.*refused)")


def lines_that_matter(output: str, limit: int = 6) -> list[str]:
    """The lines of a failed step's output a person should see first: errors, else the last lines."""
    lines = [ln.rstrip() for ln in output.splitlines() if ln.strip()]
    picked = [ln for ln in lines if _MATTERS.match(ln.strip())]
    return (picked or lines)[-limit:]
