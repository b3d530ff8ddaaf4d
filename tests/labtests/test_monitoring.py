"""Monitoring on the lab's demo fleet (issue 20): the DCGM exporter on every GPU node and nowhere else, one
DCGM_FI_DEV_GPU_UTIL series per GPU read through the API server's pod proxy, every target up in the deployed
Prometheus; a second run changes nothing; verify names each fault by its cause; --remove removes every object
monitoring created and nothing else."""

from __future__ import annotations

import json
import time
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from tests.labtests.test_phases import cluster_writes

DEMO = Path(__file__).resolve().parents[1] / "lab" / "fleets" / "demo.yaml"
NS = "gpu-monitoring"
KUBECTL = "kubectl --kubeconfig /etc/kubernetes/admin.conf "
GPU_NODES = {"gpu-1": 8, "gpu-2": 8, "gpu-3": 4}  # the demo fleet's GPU workers


def objects(lab) -> set[tuple[str, str, str]]:
    """(kind, namespace, name) of every object the simulated API server stores, except pods gpuk8s verify makes."""
    out = set()
    for kind in ("daemonset", "service", "deployment", "configmap", "role", "rolebinding", "serviceaccount",
                 "namespace", "runtimeclass", "pod"):
        r = lab.host("cp-1").exec(KUBECTL + f"get {kind} -A -o json")
        for o in json.loads(r.stdout)["items"]:
            if kind == "pod" and o["metadata"].get("ownerReferences"):
                continue  # a DaemonSet's pod: it goes with its DaemonSet
            out.add((o["kind"], o["metadata"].get("namespace", ""), o["metadata"]["name"]))
    return out


def apply(lab, obj: dict) -> None:
    cp = lab.host("cp-1")
    cp.write("/root/gpuk8s-test-object.json", json.dumps(obj))
    cp.exec(KUBECTL + "apply -f /root/gpuk8s-test-object.json")


def exporter_nodes(lab) -> dict[str, str]:
    r = lab.host("cp-1").exec(KUBECTL + f"get pods -n {NS} -o json")
    return {p["spec"]["nodeName"]: p["metadata"]["name"] for p in json.loads(r.stdout)["items"]
            if p["metadata"]["labels"].get("app.kubernetes.io/name") == "dcgm-exporter"}


def util_series(text: str) -> list[dict[str, str]]:
    return [dict(s.labels) for f in text_string_to_metric_families(text) for s in f.samples
            if s.name == "DCGM_FI_DEV_GPU_UTIL"]


def verify(run_cli, inv: str) -> tuple[int, dict, dict]:
    r = run_cli("verify", "-i", inv, "-o", "json", "--no-test-pods")
    rep = json.loads(r.stdout)
    phase = next(p for p in rep["phases"] if p["name"] == "monitoring-verify")
    return r.returncode, phase, rep


def mon_phase(r) -> dict:
    """The monitoring phase of `gpuk8s monitoring -o json` (after the cluster lock's)."""
    phases = json.loads(r.stdout)["phases"]
    assert [p["name"] for p in phases][:1] == ["lock"], phases  # the cluster lock first, as install takes it
    return next(p for p in phases if p["name"] == "monitoring")


def test_monitoring_on_the_demo_fleet(lab_up, run_cli, tmp_path):
    lab = lab_up(DEMO.read_text())
    inv = str(lab.inventory)
    t0 = time.monotonic()
    r = run_cli("install", "-i", inv, "-o", "json", "--no-test-pods", "--kubeconfig-out", str(tmp_path / "kc"))
    assert r.returncode == 0, r.stdout + r.stderr
    t_install = time.monotonic() - t0
    assert "monitoring" not in [p["name"] for p in json.loads(r.stdout)["phases"]]  # not enabled yet
    cp = lab.host("cp-1")
    apply(lab,  # a user's object with a name monitoring also uses
          {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "prometheus-config", "namespace": "default"},
           "data": {"prometheus.yml": "{}"}})
    before = objects(lab)

    lab.inventory.write_text(lab.inventory.read_text() + "\nmonitoring:\n  enabled: true\n  grafana: true\n")
    t0 = time.monotonic()
    r = run_cli("monitoring", "-i", inv, "-o", "json")
    t_monitoring = time.monotonic() - t0
    assert r.returncode == 0, r.stdout + r.stderr
    phase = mon_phase(r)
    assert phase["status"] == "changed" and "(prometheus: deploy)" in phase["message"]
    assert "emptyDir" in phase["message"]  # no storage class: the warning that data is lost on restart
    created = objects(lab) - before
    assert {("DaemonSet", NS, "dcgm-exporter"), ("Service", NS, "dcgm-exporter"), ("Deployment", NS, "prometheus"),
            ("Deployment", NS, "grafana"), ("Namespace", "", NS)} <= created
    assert before <= objects(lab)

    # the exporter on every GPU node and nowhere else
    pods = exporter_nodes(lab)
    assert set(pods) == set(GPU_NODES)
    # one series per GPU, through the API server's pod proxy
    for node, gpus in GPU_NODES.items():
        text = cp.exec(KUBECTL + f"get --raw /api/v1/namespaces/{NS}/pods/{pods[node]}:9400/proxy/metrics").stdout
        series = util_series(text)
        assert sorted(int(s["gpu"]) for s in series) == list(range(gpus))
        assert {s["Hostname"] for s in series} == {node} and not any(s.get("pod") for s in series)
    t0 = time.monotonic()
    code, phase, rep = verify(run_cli, inv)
    t_verify = time.monotonic() - t0
    assert code == 0 and phase["status"] == "passed", phase
    assert phase["message"] == "3 exporter(s) serve every GPU"
    assert "exporter dcgm-exporter-gpu-1: 8 GPU(s) reported" in phase["hosts"]["gpu-1"]

    # a second run changes nothing: neither `gpuk8s monitoring` nor install's monitoring phase
    writes = len(cluster_writes(lab))
    r = run_cli("monitoring", "-i", inv, "-o", "json")
    assert r.returncode == 0 and mon_phase(r)["status"] == "unchanged"
    r = run_cli("install", "-i", inv, "-o", "json", "--no-test-pods", "--kubeconfig-out", str(tmp_path / "kc"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert {p["name"]: p["status"] for p in json.loads(r.stdout)["phases"]}["monitoring"] == "unchanged"
    assert len(cluster_writes(lab)) == writes

    # a GPU pod on gpu-1: the exporter names it (the pod-resources mount)
    apply(lab, {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "train", "namespace": "default"},
                "spec": {"nodeName": "gpu-1", "containers": [{"name": "main", "image": "cuda",
                                                              "resources": {"limits": {"nvidia.com/gpu": 2}}}]}})
    text = cp.exec(KUBECTL + f"get --raw /api/v1/namespaces/{NS}/pods/{pods['gpu-1']}:9400/proxy/metrics").stdout
    named = [s for s in util_series(text) if s.get("pod")]
    assert [(s["gpu"], s["pod"], s["namespace"], s["container"]) for s in named] == \
        [("0", "train", "default", "main"), ("1", "train", "default", "main")]

    # fault 1: the exporter without the kubelet's pod-resources mount (a hand-edited DaemonSet)
    ds = json.loads(cp.exec(KUBECTL + f"get daemonset dcgm-exporter -n {NS} -o json").stdout)
    ds["metadata"]["annotations"] = {}
    ds["spec"]["template"]["spec"]["containers"][0]["volumeMounts"] = []
    apply(lab, ds)
    text = cp.exec(KUBECTL + f"get --raw /api/v1/namespaces/{NS}/pods/{pods['gpu-1']}:9400/proxy/metrics").stdout
    assert not any(s.get("pod") for s in util_series(text))
    code, phase, _ = verify(run_cli, inv)
    assert code == 1 and phase["status"] == "failed"
    assert all(phase["hosts"][n].startswith("monitoring.no-pod-labels: ") for n in GPU_NODES), phase
    r = run_cli("monitoring", "-i", inv, "-o", "json")  # gpuk8s monitoring repairs it
    assert mon_phase(r)["message"].startswith("applied dcgm-exporter.yaml")
    assert verify(run_cli, inv)[0] == 0

    # fault 2: Prometheus without the target (the exporter's Service deleted by hand)
    cp.exec(KUBECTL + f"delete service dcgm-exporter -n {NS}")
    code, phase, _ = verify(run_cli, inv)
    assert code == 1
    assert all("; monitoring.target-missing: Prometheus has no target for the exporter on " + n in
               phase["hosts"][n] for n in GPU_NODES), phase
    assert phase["hosts"]["gpu-1"].startswith("exporter dcgm-exporter-gpu-1: 8 GPU(s)")  # the exporter itself is fine
    run_cli("monitoring", "-i", inv)
    assert verify(run_cli, inv)[0] == 0

    # fault 3: a node whose runtime default is runc: the exporter crashes with NVML's message, named as such
    w = lab.host("gpu-3")

    def default_runtime(old: str, new: str) -> None:
        # config.toml, and the toolkit's drop-in where nvidia-ctk >= 1.18 put it (the default minor's toolkit)
        for f in ("/etc/containerd/config.toml", "/etc/containerd/conf.d/99-nvidia.toml"):
            text = w.read(f)
            if text and f'default_runtime_name = "{old}"' in text:
                w.write(f, text.replace(f'default_runtime_name = "{old}"', f'default_runtime_name = "{new}"'))

    default_runtime("nvidia", "runc")
    code, phase, rep = verify(run_cli, inv)
    assert code == 1
    assert phase["hosts"]["gpu-3"].startswith("monitoring.exporter-nvml: ")
    assert "runtime's default on the node is not nvidia" in phase["hosts"]["gpu-3"]
    assert phase["hosts"]["gpu-1"].startswith("exporter dcgm-exporter-gpu-1")  # the others are fine
    logs = cp.exec(KUBECTL + f"logs {pods['gpu-3']} -n {NS} --tail=20").stdout
    assert "Cannot init NVML library; err: ERROR_LIBRARY_NOT_FOUND" in logs
    default_runtime("runc", "nvidia")

    # --remove removes every object monitoring created, and nothing else (the user's pod and ConfigMap stay)
    r = run_cli("monitoring", "-i", inv, "-o", "json", "--remove", "--dry-run")
    assert r.returncode == 0 and objects(lab) - before == created | {("Pod", "default", "train")}
    r = run_cli("monitoring", "-i", inv, "-o", "json", "--remove")
    assert r.returncode == 0, r.stdout + r.stderr
    assert objects(lab) == before | {("Pod", "default", "train")}
    assert exporter_nodes(lab) == {}
    r = run_cli("monitoring", "-i", inv, "-o", "json", "--remove")
    assert mon_phase(r)["status"] == "unchanged"
    print(f"\nlab figures: install {t_install:.1f} s, gpuk8s monitoring {t_monitoring:.1f} s, "
          f"verify {t_verify:.1f} s")
