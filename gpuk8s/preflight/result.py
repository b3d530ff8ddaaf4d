"""Check results: a stable id, a severity, a status, what was found and what to do."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any, Literal

Status = Literal["pass", "warn", "fail", "skip"]
Severity = Literal["error", "warning"]

# Every check id with its severity. Ids are stable: users pass them to --ignore and
# scripts read them from --output json.
CHECKS: dict[str, Severity] = {
    "facts.parse": "error",
    "ssh.reachable": "error",
    "ssh.sudo": "error",
    "os.supported": "error",
    "os.arch": "error",
    "gpu.driver": "error",
    "gpu.driver-version": "error",
    "gpu.count": "error",
    "gpu.cuda": "warning",
    "runtime.installed": "error",
    "runtime.config": "error",
    "runtime.version": "error",
    "runtime.active": "error",
    "runtime.cri-plugin": "error",
    "runtime.kubernetes-compat": "error",
    "runtime.cgroup-driver": "warning",
    "toolkit.installed": "warning",
    "toolkit.default-runtime": "warning",
    "k8s.swap": "warning",
    "k8s.modules": "warning",
    "k8s.sysctl": "warning",
    "k8s.ports": "error",
    "k8s.cpus": "error",
    "k8s.memory": "error",
    "k8s.hostname": "warning",
    "k8s.tools": "warning",
    "k8s.firewalld": "warning",
    "cluster.os-consistent": "error",
    "cluster.kernel-consistent": "warning",
    "cluster.arch-consistent": "warning",
    "cluster.unique-hostnames": "error",
    "cluster.unique-macs": "error",
    "cluster.unique-product-uuid": "error",
    "cluster.unique-machine-id": "error",
    "cluster.clock-skew": "warning",
    "cluster.reachable": "error",
    "net.rtt": "warning",
    "net.bandwidth": "warning",
}


@dataclass(frozen=True)
class CheckResult:
    id: str
    status: Status
    severity: Severity
    message: str
    remedy: str = ""
    ignored: bool = False

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def passed(check_id: str, message: str) -> CheckResult:
    return CheckResult(check_id, "pass", CHECKS[check_id], message)


def skipped(check_id: str, message: str, remedy: str = "") -> CheckResult:
    return CheckResult(check_id, "skip", CHECKS[check_id], message, remedy)


def failed(check_id: str, message: str, remedy: str) -> CheckResult:
    """A finding: 'fail' for error-severity checks, 'warn' for warnings."""
    sev = CHECKS[check_id]
    return CheckResult(check_id, "fail" if sev == "error" else "warn", sev, message, remedy)


def apply_ignores(results: list[CheckResult], ignore: set[str]) -> list[CheckResult]:
    """--ignore ID (or 'all') turns a failure of that check into a warning, like kubeadm's flag."""
    out = []
    for r in results:
        if r.status == "fail" and (r.id in ignore or "all" in ignore):
            r = replace(r, status="warn", ignored=True, message=r.message + " (ignored)")
        out.append(r)
    return out
