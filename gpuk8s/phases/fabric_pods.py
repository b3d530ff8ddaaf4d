"""The test pods of verify --fabric (issue 43): the one pod shape every fabric test runs in, and when the poll loops
are done with one. Shared by phases/fabric_verify.py (NCCL per node, perftest) and phases/fabric_nccl.py (NCCL
across nodes)."""

from __future__ import annotations

from typing import Any, TypeGuard

from gpuk8s import mirrors, versions
from gpuk8s.kube import manifests, state
from gpuk8s.phases.base import Context
from gpuk8s.phases.verify import TEST_NAMESPACE

PROOF_LABELS = {"app.kubernetes.io/managed-by": "gpuk8s", "gpuk8s.io/proof": "fabric"}


def test_pod(ctx: Context, name: str, node: str, command: list[str], limits: dict[str, int],
             host_network: bool) -> dict[str, Any]:
    """A fabric test pod on `node`: the test image (through the mirror), `limits`, IPC_LOCK, never restarted."""
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": TEST_NAMESPACE, "labels": dict(PROOF_LABELS)},
        "spec": {
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]}}},
            "restartPolicy": "Never",
            "tolerations": [{"operator": "Exists"}],
            **({"hostNetwork": True} if host_network else {}),
            "terminationGracePeriodSeconds": 0,
            "containers": [{
                "name": "test", "image": mirrors.image(ctx.inv, versions.fabric().test_image), "command": command,
                "resources": {"limits": dict(limits)},
                # RDMA pins memory: the runtime's default memlock limit (64 KiB or 8 MiB) is too small
                "securityContext": {"capabilities": {"add": ["IPC_LOCK"]}}}],
        },
    }


def leftovers(ctx: Context) -> list[str]:
    """The fabric test pods an earlier run left (killed midway), whatever their names: a worker of a ring that has
    changed since holds all of its node's GPUs until it is deleted. Only gpuk8s's: its proof label and its own
    managed-by label (a user's pod of any name is never one)."""
    return sorted(str(md.get("name")) for p in ctx.kube.get("pods", namespace=TEST_NAMESPACE)
                  if isinstance(md := p.get("metadata"), dict) and isinstance(md.get("labels"), dict)
                  and md["labels"].get("gpuk8s.io/proof") == PROOF_LABELS["gpuk8s.io/proof"]
                  and manifests.created_by_gpuk8s(p) and str(md.get("name", "")).startswith("gpuk8s-fabric-"))


def unschedulable(pod: state.PodState | None) -> TypeGuard[state.PodState]:
    """A test pod the scheduler cannot place."""
    return pod is not None and pod.phase == "Pending" and bool(pod.unschedulable)


def over(pod: state.PodState | None, *also: str) -> bool:
    """Whether a poll loop is done with a test pod: ended (or in one of the phases `also`), or one the scheduler
    cannot place (it is named as not scheduled; waiting for other pods to free the node's GPUs could take the whole
    timeout)."""
    return pod is not None and (pod.phase in ("Succeeded", "Failed", *also) or unschedulable(pod))
