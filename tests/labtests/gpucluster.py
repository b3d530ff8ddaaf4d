"""A lab GPU cluster installed once per test module, for the status and doctor tests (test_status.py,
test_doctor.py, test_scale.py): the gpuk8s CLI run as a user would, kubectl on the control plane, GPU pods, doctor's
JSON checked against its schema, the timings of install, status and doctor, and a cluster loaded with ordinary pods
of real size (real_pods, Cluster.load)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from tests.conftest import lab_unavailable

ROOT = Path(__file__).resolve().parents[2]
KUBECTL = "kubectl --kubeconfig /etc/kubernetes/admin.conf "
STATUS_SCHEMA = json.loads((ROOT / "docs" / "status.schema.json").read_text())
DOCTOR_SCHEMA = json.loads((ROOT / "docs" / "doctor.schema.json").read_text())
IMAGE = "nvidia/cuda:12.0.0-base-ubuntu22.04"
REAL = ROOT / "tests" / "fixtures" / "real" / "objects"  # real Node and Pod objects, verbatim (SOURCE.md)
# what the API server and the kubelet add to a pod (the simulated API server adds them when it serves the pod)
_SERVER_SET = ("uid", "resourceVersion", "creationTimestamp", "managedFields", "selfLink", "generateName")


def real_pods(count: int, nodes: list[str], namespace: str = "apps", annotation_bytes: int = 4096,
              prefix: str = "queue") -> list[dict[str, Any]]:
    """`count` ordinary pods of real size, bound round-robin to `nodes` as a scheduler binds a ReplicaSet's pods
    (spec.nodeName; restartPolicy Always: they run). Each is the minikube pod of pods-kuard-minikube.json (its
    labels, ownerReferences, container) with the Run:ai pod's container of pod-gpu-runai-fraction.yaml (17 env
    vars, mounts) as a second container and that pod's volumes, as applied (what the API server sets is left for
    it: uid, status, the kube-api-access volume), plus an annotation of `annotation_bytes` (issue 27 measured
    300 pods with 4 KB each). Served by the lab, one is ~14 KB of `kubectl get pods -o json`, as real pods of that
    shape are."""
    kuard = json.loads((REAL / "pods-kuard-minikube.json").read_text())["items"][0]
    runai = yaml.safe_load((REAL / "pod-gpu-runai-fraction.yaml").read_text())
    token = lambda name: name.startswith("kube-api-access-")  # noqa: E731  (the API server's own volume)
    second = {k: v for k, v in runai["spec"]["containers"][0].items()}
    second["volumeMounts"] = [m for m in second.get("volumeMounts", []) if not token(m["name"])]
    main = dict(kuard["spec"]["containers"][0])
    main["volumeMounts"] = [m for m in main.get("volumeMounts", []) if not token(m["name"])]
    volumes = [v for v in runai["spec"].get("volumes", []) if not token(v["name"])]
    ballast = ("0123456789abcdef" * (annotation_bytes // 16 + 1))[:annotation_bytes]
    pods = []
    for i in range(count):
        md = {k: v for k, v in kuard["metadata"].items() if k not in _SERVER_SET}
        md.update({"name": f"{prefix}-{i:05d}", "namespace": namespace,
                   **({"annotations": {"lab.gpuk8s.io/ballast": ballast}} if annotation_bytes else {})})
        spec = {"containers": [main, second], "volumes": volumes, "nodeName": nodes[i % len(nodes)],
                "restartPolicy": "Always", "terminationGracePeriodSeconds": 30, "dnsPolicy": "ClusterFirst"}
        pods.append({"apiVersion": "v1", "kind": "Pod", "metadata": md, "spec": spec})
    return pods


class Cluster:
    def __init__(self, lab: Any, tmp: Path) -> None:
        self.lab, self.tmp, self.inv = lab, tmp, str(lab.inventory)
        self.times: dict[str, float] = {}  # seconds: install, the slowest doctor, what a test records

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "GPUK8S_LOG_FILE": str(self.tmp / "gpuk8s.log"), "NO_COLOR": "1"}
        return subprocess.run([sys.executable, "-m", "gpuk8s", *args], capture_output=True, text=True, env=env,
                              timeout=300, cwd=self.tmp, stdin=subprocess.DEVNULL)

    def doctor(self, *args: str) -> tuple[int, dict[str, Any]]:
        t0 = time.monotonic()
        r = self.cli("doctor", "-i", self.inv, "-o", "json", *args)
        self.times["doctor"] = max(self.times.get("doctor", 0.0), time.monotonic() - t0)
        doc = json.loads(r.stdout)
        jsonschema.validate(doc, DOCTOR_SCHEMA)
        return r.returncode, doc

    def kubectl(self, args: str) -> str:
        return self.lab.host("cp-1").exec(KUBECTL + args).stdout

    def pod(self, name: str, limits: dict[str, Any], node: str | None = None, *, ns: str = "default",
            command: list[str] | None = None, image: str = IMAGE, log: str | None = None, **spec: Any) -> None:
        """Apply a one-container pod; node pins it by hostname, log is the workload's own log (the lab's override
        lab.gpuk8s.io/log), spec holds further pod spec fields (nodeSelector, tolerations, schedulerName...)."""
        if node:
            spec["nodeSelector"] = {"kubernetes.io/hostname": node}
        md: dict[str, Any] = {"name": name, "namespace": ns}
        if log is not None:
            md["annotations"] = {"lab.gpuk8s.io/log": log}
        obj = {"apiVersion": "v1", "kind": "Pod", "metadata": md,
               "spec": {"restartPolicy": "Never", **spec,
                        "containers": [{"name": "main", "image": image, "command": command or ["sleep", "infinity"],
                                        "resources": {"limits": limits}}]}}
        cp = self.lab.host("cp-1")
        cp.write(f"/root/{name}.json", json.dumps(obj))
        cp.exec(KUBECTL + f"apply -f /root/{name}.json")

    def delete(self, *names: str, ns: str = "default") -> None:
        self.kubectl(f"delete pod {' '.join(names)} -n {ns}")

    def phase(self, name: str, ns: str = "default") -> dict[str, Any]:
        """The pod's object (its status.phase, spec.nodeName...)."""
        return json.loads(self.kubectl(f"get pod {name} -n {ns} -o json"))

    def pods(self) -> dict[str, Any]:
        """Every pod in the cluster (kubectl get pods -A)."""
        return json.loads(self.kubectl("get pods -A -o json"))

    def load(self, count: int, nodes: list[str], namespace: str = "apps", annotation_bytes: int = 4096) -> None:
        """Add `count` ordinary pods of real size (real_pods) in one kubectl apply of a List."""
        cp = self.lab.host("cp-1")
        name = f"/root/load-{namespace}-{count}.json"
        items = real_pods(count, nodes, namespace, annotation_bytes)
        cp.write(name, json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
        cp.exec(KUBECTL + f"apply -f {name} >/dev/null")


def installed(tmp_path_factory: pytest.TempPathFactory, name: str, fleet: str,
              configure: Callable[[Path], None] | None = None) -> Iterator[Cluster]:
    """For a module-scoped fixture: bring up the fleet, let configure edit the lab's inventory, install (no test
    pods) and yield the cluster; the lab goes down after the module, its timings printed."""
    reason = lab_unavailable()
    if reason:
        pytest.skip(reason)
    from tests.lab.lab import Lab

    tmp = tmp_path_factory.mktemp(name)
    lab = Lab()
    f = tmp / "fleet.yaml"
    f.write_text(fleet)
    lab.up(f)
    c = Cluster(lab, tmp)
    try:
        if configure:
            configure(lab.inventory)
        t0 = time.monotonic()
        r = c.cli("install", "-i", c.inv, "-o", "json", "--no-test-pods", "--kubeconfig-out", str(tmp / "kc"))
        c.times["install"] = time.monotonic() - t0
        assert r.returncode == 0, r.stdout + r.stderr
        yield c
    finally:
        lab.down()
        print("lab timings (s):", {k: round(v, 1) for k, v in c.times.items()})
