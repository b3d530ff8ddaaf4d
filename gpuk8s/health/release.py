"""`gpuk8s health --release HOST...`: the quarantine taint removed from each named node whose GPUs pass the check
now (docs/health.md). Only the taint gpuk8s put there (key gpuk8s.io/quarantine) is removed, through kubectl on the
first control plane; a node still unhealthy keeps it."""

from __future__ import annotations

from gpuk8s import findings
from gpuk8s.errors import GpuK8sError
from gpuk8s.gpuplan import QUARANTINE_KEY
from gpuk8s.health.checks import DCGM_RUNS
from gpuk8s.health.run import HealthReport
from gpuk8s.inventory.model import Inventory
from gpuk8s.kube import state
from gpuk8s.kube.client import KubeClient, SSHKubectl
from gpuk8s.remote import Session


def release(inv: Inventory, report: HealthReport, sudo_passwords: dict[str, str]) -> None:
    """Add a health.release finding to every host of `report`, removing the quarantine taint where the host is
    healthy now; the first control plane unreachable (or its API) fails every host's."""
    cp = inv.control_planes[0]
    try:
        with Session(cp, sudo_passwords.get(cp.name)) as s:
            release_with(SSHKubectl(s), report)
    except GpuK8sError as e:  # unreachable, kubectl failed, a node object unreadable
        for h in report.hosts:
            h.findings.append(findings.failed(
                "health.release", f"not released: the cluster could not be read through {cp.name}: {e.message}",
                e.remedy or f"bring {cp.name} back, then run gpuk8s health --release again"))


def release_with(kube: KubeClient, report: HealthReport) -> None:
    nodes = state.by_name(kube.get("nodes"))
    for h in report.hosts:
        name = h.host.name
        was = state.quarantined(nodes.get(name))
        if name not in nodes:
            f = findings.skipped("health.release", "not a node of the cluster: nothing to release")
        elif not was:
            f = findings.passed("health.release", "not quarantined")
        elif was == "health.dcgm-diag" and report.level not in DCGM_RUNS:
            # quarantined by DCGM's diagnostic: the quick level cannot tell that its fault is gone
            f = findings.failed("health.release", f"kept in quarantine ({was}): DCGM's diagnostic put it there and "
                                "the quick level does not run it",
                                f"run gpuk8s health --release {name} --level standard (or long)")
        elif was == "health.rdma-links" and report.level != "fabric":
            f = findings.failed("health.release", f"kept in quarantine ({was}): the fabric level's check put it there "
                                f"and the {report.level} level does not run it",
                                f"run gpuk8s health --release {name} --level fabric")
        elif was.startswith("fabric."):
            # verify --fabric's tests (NCCL, RDMA write) put it there: health does not run them
            f = findings.failed("health.release", f"kept in quarantine ({was}): gpuk8s verify --fabric put it there "
                                "and health does not run its tests",
                                "once the fault is fixed: gpuk8s verify --fabric --quarantine (it releases the node "
                                "when the test that put it there passes)")
        elif not h.ok:
            bad = next((x for x in h.findings if not x.ok), None)
            f = findings.failed("health.release", f"kept in quarantine ({was}): its GPUs fail the check now"
                                + (f" ({bad.id})" if bad else ""),
                                "fix the fault the findings above name (reset the GPU, reboot, or replace it), then "
                                "run gpuk8s health --release again")
        elif (why := unproven(was, h.findings)) is not None:
            # nothing failed is not enough: the check that put the node there must have run and passed now (a
            # skipped check, say nvidia-smi -q timing out or the kernel log unreadable, proves nothing)
            f = findings.failed("health.release", f"kept in quarantine ({was}): {why}",
                                f"make the check run (the finding's reason above says why it could not), then run "
                                f"gpuk8s health --release {name} again; to release it without proof: kubectl taint "
                                f"nodes {name} {QUARANTINE_KEY}:NoSchedule-")
        else:
            try:
                kube.taint(name, [f"{QUARANTINE_KEY}:NoSchedule-"])
                f = findings.passed("health.release", f"released: the quarantine taint ({was}) removed, the node "
                                    "takes pods again")
            except GpuK8sError as e:  # this node's alone: the others are released or not on their own
                f = findings.failed("health.release", f"not released: kubectl taint failed: {e.message}",
                                    e.remedy or f"run gpuk8s health --release {name} again")
        h.findings.append(f)


def unproven(was: str, ran: list[findings.Finding]) -> str | None:
    """Why the findings of this run do not prove the fault named by the quarantine taint (`was`, a finding id) is
    gone; None when that finding ran and passed."""
    f = next((x for x in ran if x.id == was), None)
    if f is None:
        return f"the check that put it there ({was}) did not run now"
    if f.status != "pass":
        return f"the check that put it there did not pass now ({f.status}: {f.message})"
    return None
