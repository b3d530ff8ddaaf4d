"""`gpuk8s inventory import` on the lab: a Kubespray INI inventory of a lab fleet imports, validates, and
`gpuk8s preflight` passes on it."""

from __future__ import annotations

import json
import shutil
import time

FLEET = ("hosts:\n  - name: cp-1\n    role: control-plane\n    gpus: 0\n  - name: gpu-1\n    gpus: 2\n"
         "  - name: gpu-2\n    gpus: 2\n")


def kubespray_ini(lab) -> str:
    """The lab fleet as a Kubespray operator would have written it (inventory/sample/inventory.ini layout)."""
    lines = ["[all]"]
    for h in lab.hosts.values():
        lines.append(f"{h.name} ansible_host={h.address} ip={h.address} etcd_member_name=etcd-{h.name}")
    lines += ["", "[kube_control_plane]", "cp-1", "", "[etcd]", "cp-1", "", "[kube_node]", "gpu-1", "gpu-2", "",
              "[calico_rr]", "", "[k8s_cluster:children]", "kube_control_plane", "kube_node", "calico_rr", "",
              "[all:vars]", "ansible_user=gpuk8s", f"ansible_ssh_private_key_file={lab.key}", "ansible_become=true",
              "kube_network_plugin=calico", "kube_version=v1.30.14"]  # containerd 1.6 on the lab hosts
    return "\n".join(lines) + "\n"


def test_imported_lab_inventory_validates_and_passes_preflight(lab_up, run_cli, tmp_path):
    lab = lab_up(FLEET)
    src = tmp_path / "inventory.ini"
    src.write_text(kubespray_ini(lab))
    out = tmp_path / "imported.yaml"
    t0 = time.monotonic()
    r = run_cli("inventory", "import", str(src), "-o", str(out), "--json")
    took = time.monotonic() - t0
    assert r.returncode == 0, r.stdout + r.stderr
    rep = json.loads(r.stdout)
    assert {h["name"]: h["role"] for h in rep["hosts"]} == {"cp-1": "control-plane", "gpu-1": "worker",
                                                           "gpu-2": "worker"}
    # etcd_member_name has no equivalent (ip equals the SSH address here); kube_version's patch is dropped
    kinds = {(n["key"], n["kind"]) for n in rep["not_imported"]}
    assert kinds == {("etcd_member_name", "not-imported"), ("kube_version", "changed")}
    assert sorted(n["line"] for n in rep["not_imported"] if n["key"] == "etcd_member_name") == [2, 3, 4]
    assert "kubernetes_version: \"1.30\"" in out.read_text()
    r = run_cli("inventory", "validate", "-i", str(out))
    assert r.returncode == 0, r.stdout + r.stderr
    # the imported inventory verifies host keys against ~/.ssh/known_hosts, as a Kubespray user's would
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    shutil.copy(lab.known_hosts, home / ".ssh" / "known_hosts")
    r = run_cli("preflight", "-i", str(out), "-o", "json", "--network-seconds", "0", env={"HOME": str(home)})
    assert r.returncode == 0, r.stdout + r.stderr
    report = json.loads(r.stdout)
    assert [h["name"] for h in report["hosts"]] == ["cp-1", "gpu-1", "gpu-2"]
    assert all(c["status"] != "fail" for h in report["hosts"] for c in h["checks"])
    print(f"import of a 3-host lab inventory: {took:.2f} s")
