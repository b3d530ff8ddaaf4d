"""gpuk8s upgrade on the lab: the oldest supported minor to the next, GPU pods waited for, resume after an
interruption, skipping refused, --dry-run changes nothing."""

from __future__ import annotations

import json
import time

import yaml

from gpuk8s import versions

FLEET = """
hosts:
  - name: cp-1
    role: control-plane
  - name: gpu-1
    gpus: 2
  - name: gpu-2
    gpus: 1
"""
OLDEST = min(versions.supported_minors(), key=lambda m: int(m.split(".")[1]))
NEXT = f"1.{int(OLDEST.split('.')[1]) + 1}"


def nodes(lab) -> dict[str, dict]:
    out = lab.host("cp-1").exec("kubectl --kubeconfig /etc/kubernetes/admin.conf get nodes -o json").stdout
    return {n["metadata"]["name"]: n for n in json.loads(out)["items"]}


def kubelets(lab) -> dict[str, str]:
    return {k: n["status"]["nodeInfo"]["kubeletVersion"] for k, n in nodes(lab).items()}


def installed(lab, tmp_path, run_cli) -> str:
    """The lab's cluster installed at the oldest minor gpuk8s supports; the inventory's path."""
    inv = yaml.safe_load(lab.inventory.read_text())
    inv["cluster"]["kubernetes_version"] = OLDEST
    path = tmp_path / "inventory.yaml"
    path.write_text(yaml.safe_dump(inv, sort_keys=False))
    r = run_cli("install", "-i", str(path), "-o", "json", "--kubeconfig-out", str(tmp_path / "kc"),
                "--no-test-pods")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert {v.split(".")[1] for v in kubelets(lab).values()} == {OLDEST.split(".")[1]}
    return str(path)


def test_dry_run_changes_nothing_then_upgrade_with_a_gpu_pod_waited_for(lab_up, run_cli, tmp_path):
    lab = lab_up(FLEET)
    inv = installed(lab, tmp_path, run_cli)
    before = kubelets(lab)
    logs = {h: len(lab.host(h).commands()) for h in ("cp-1", "gpu-1", "gpu-2")}
    r = run_cli("upgrade", "-i", inv, "-o", "json", "--dry-run")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    rep = json.loads(r.stdout)
    assert rep["dry_run"] and rep["steps"] == [NEXT] and rep["from"] == OLDEST
    plans = {p["name"]: p for p in rep["plans"]}
    assert plans["upgrade-control-planes"]["status"] == "would-change"
    assert any("kubeadm upgrade apply" in c["what"] for c in plans["upgrade-control-planes"]["changes"])
    assert plans["upgrade-workers"]["status"] == "would-change"
    assert kubelets(lab) == before
    table = run_cli("upgrade", "-i", inv, "--dry-run")  # for people: the exact commands
    assert table.returncode == 0 and "kubeadm upgrade" in table.stdout and "upgrade-packages" not in table.stderr
    piped = run_cli("upgrade", "-i", inv)  # no --yes and no terminal: refused, nothing done
    assert piped.returncode == 2 and "--yes" in piped.stderr
    for h, n in logs.items():
        new = lab.host(h).commands()[n:]
        assert not any(c[:1] == ["kubeadm"] and "upgrade" in c for c in new), new
        assert not any(c[:1] in (["apt-get"], ["dnf"]) and "install" in c for c in new), (h, new)

    # a GPU job on gpu-1 in its own namespace, running for 20 s: named and waited for before the drain (it ran 6 s,
    # and under make test's 4 workers the control plane's upgrade before gpu-1's took longer once: the job had ended)
    job = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "train-0", "namespace": "ml",
                        "annotations": {"lab.gpuk8s.io/runs-seconds": "20", "lab.gpuk8s.io/created": str(time.time())},
                        "ownerReferences": [{"kind": "Job", "name": "train"}]},
           "spec": {"nodeName": "gpu-1", "containers": [{"name": "c", "image": "cuda",
                                                          "resources": {"limits": {"nvidia.com/gpu": 1}}}]}}
    lab.host("cp-1").exec("kubectl --kubeconfig /etc/kubernetes/admin.conf apply -f - <<'X'\n"
                          + json.dumps(job) + "\nX\n")
    # gpu-2 cordoned by its operator for maintenance: upgraded, and left cordoned
    lab.host("cp-1").exec("kubectl --kubeconfig /etc/kubernetes/admin.conf cordon gpu-2")
    t0 = time.monotonic()
    r = run_cli("upgrade", "-i", inv, "-o", "json", "--yes", "--gpu-pod-timeout", "120")
    seconds = time.monotonic() - t0
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    rep = json.loads(r.stdout)
    assert rep["steps"] == [NEXT]
    after = kubelets(lab)
    assert all(v.startswith(f"v{NEXT}.") for v in after.values()), after
    cordoned = {k for k, n in nodes(lab).items() if n.get("spec", {}).get("unschedulable")}
    assert cordoned == {"gpu-2"}, cordoned
    mark = "gpuk8s.io.node-restriction.kubernetes.io/cordoned-by"
    assert not any(mark in n["metadata"].get("labels", {}) for n in nodes(lab).values())
    workers = next(p for p in rep["phases"] if p["name"] == f"upgrade-workers@{NEXT}")
    assert "waited for GPU pods ml/train-0" in workers["hosts"]["gpu-1"], workers
    assert "left cordoned" in workers["hosts"]["gpu-2"], workers
    # every GPU schedulable again, the device plugin at the new minor's pin
    lab.host("cp-1").exec("kubectl --kubeconfig /etc/kubernetes/admin.conf uncordon gpu-2")
    gpus = {k: int(n["status"]["allocatable"].get("nvidia.com/gpu", 0)) for k, n in nodes(lab).items()}
    assert gpus["gpu-1"] == 2 and gpus["gpu-2"] == 1
    assert all(n["ok"] for n in rep["nodes"]), rep["nodes"]
    pin = versions.install_defaults(NEXT)["device_plugin_version"]
    ds = lab.host("cp-1").exec("kubectl --kubeconfig /etc/kubernetes/admin.conf get ds -A -o json").stdout
    assert pin in ds
    ids = {(f["subject"]["name"], f["id"], f["status"]) for f in rep["findings"]}
    assert ids == {(n, "upgrade.node-upgraded", "pass") for n in ("cp-1", "gpu-1", "gpu-2")}
    held = lab.host("gpu-1").exec("apt-mark showhold").stdout.split()
    assert {"kubeadm", "kubelet", "kubectl"} <= set(held)
    print(f"\nupgrade {OLDEST} -> {NEXT}: {seconds:.1f} s in all; per node: {rep['node_seconds']}")

    # again: nothing left at this minor; the next run would go on to the next minor, not skip one
    r = run_cli("upgrade", "-i", inv, "-o", "json", "--to", NEXT, "--yes")
    assert r.returncode == 0 and json.loads(r.stdout)["steps"] == [], r.stdout


def test_interrupted_after_the_first_control_plane_resumes_and_skipping_is_refused(lab_up, run_cli, tmp_path):
    lab = lab_up(FLEET)
    inv = installed(lab, tmp_path, run_cli)
    # asked to skip a minor, kubeadm itself refuses, with its reason
    skip = f"v1.{int(NEXT.split('.')[1]) + 1}.0"
    got = lab.host("cp-1").exec(f"kubeadm upgrade apply {skip} -y", check=False)
    assert got.returncode != 0 and "kubeadm can upgrade only 1 minor version at a time" in got.stderr
    # gpuk8s refuses a downgrade and a minor it does not know, before touching anything
    for to, why in ((f"1.{int(OLDEST.split('.')[1]) - 1}", "downgrade"), ("1.99", "not in gpuk8s's version matrix")):
        r = run_cli("upgrade", "-i", inv, "-o", "json", "--to", to, "--yes")
        out = json.loads(r.stdout)
        assert r.returncode == 2 and why in out["refused"] and out["findings"][0]["id"] == "upgrade.refused", out
    # the workers' upgrade breaks: the first run stops after the control plane
    for w in ("gpu-1", "gpu-2"):
        lab.host(w).set_override("kubeadm", stderr="error execution phase preflight: lab fault\n", exit=1, repeat=99)
    r = run_cli("upgrade", "-i", inv, "-o", "json", "--yes")
    assert r.returncode == 1, r.stdout[-3000:]
    v = kubelets(lab)
    assert v["cp-1"].startswith(f"v{NEXT}.") and v["gpu-1"].startswith(f"v{OLDEST}.")
    failed = {f["subject"]["name"]: f for f in json.loads(r.stdout)["findings"] if f["status"] == "fail"}
    assert set(failed) == {"gpu-1", "gpu-2"} and failed["gpu-1"]["id"] == "upgrade.node-failed"
    assert "lab fault" in failed["gpu-1"]["message"]
    for w in ("gpu-1", "gpu-2"):
        lab.host(w).clear_override("kubeadm")
    applies = sum(1 for c in lab.host("cp-1").commands() if c[:3] == ["kubeadm", "upgrade", "apply"])
    r = run_cli("upgrade", "-i", inv, "-o", "json", "--yes")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    rep = json.loads(r.stdout)
    cps = next(p for p in rep["phases"] if p["name"] == f"upgrade-control-planes@{NEXT}")
    assert cps["status"] == "unchanged" and "already at" in cps["hosts"]["cp-1"]
    assert sum(1 for c in lab.host("cp-1").commands() if c[:3] == ["kubeadm", "upgrade", "apply"]) == applies
    assert all(x.startswith(f"v{NEXT}.") for x in kubelets(lab).values())
