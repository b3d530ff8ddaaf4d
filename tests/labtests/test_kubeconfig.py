"""`gpuk8s kubeconfig` on the lab: fetched again, merged into a kubeconfig with other contexts (which keep their
bytes), and the new context answered by the lab's API server stand-in."""

from __future__ import annotations

import json
import stat

import yaml

FLEET = """
hosts:
  - name: cp-1
    role: control-plane
  - name: gpu-1
    gpus: 2
"""

OTHERS = """\
# the operator's own kubeconfig
apiVersion: v1
kind: Config
current-context: prod
clusters:
- name: prod
  cluster:
    server: https://prod.invalid:6443   # unreachable from the lab
    certificate-authority-data: QUFBQQ==
contexts:
- name: prod
  context: {cluster: prod, user: prod-user, namespace: ml}
users:
- name: prod-user
  user:
    token: not-a-real-token
preferences: {}
"""


def test_fetch_again_and_merge_as_a_named_context(lab_up, run_cli, tmp_path):
    lab = lab_up(FLEET)
    r = run_cli("install", "-i", str(lab.inventory), "-o", "json", "--kubeconfig-out", str(tmp_path / "first"))
    assert r.returncode == 0, r.stdout + r.stderr
    admin_key = yaml.safe_load((tmp_path / "first").read_text())["users"][0]["user"]["client-key-data"]

    # fetched again to a file of its own: the same content, so unchanged; 0600
    r = run_cli("kubeconfig", "-i", str(lab.inventory), "-o", "json", "--out", str(tmp_path / "first"))
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["status"] == "unchanged"
    assert stat.S_IMODE((tmp_path / "first").stat().st_mode) == 0o600

    kc = tmp_path / "kube" / "config"
    kc.parent.mkdir()
    kc.write_text(OTHERS)
    r = run_cli("kubeconfig", "-i", str(lab.inventory), "-o", "json", "--merge", "--context", "lab-gpus",
                env={"KUBECONFIG": f"{kc}:{tmp_path / 'other'}"})
    assert r.returncode == 0, r.stdout + r.stderr
    rep = json.loads(r.stdout)
    assert (rep["status"], rep["path"], rep["context"]) == ("merged", str(kc), "lab-gpus")
    assert admin_key not in r.stdout + r.stderr  # never printed
    merged = kc.read_text()
    assert merged.startswith(OTHERS[:OTHERS.index("contexts:")])  # the other cluster: byte for byte
    for block in ("- name: prod\n  context: {cluster: prod, user: prod-user, namespace: ml}\n",
                  "- name: prod-user\n  user:\n    token: not-a-real-token\n", "current-context: prod\n"):
        assert block in merged
    assert (tmp_path / "kube" / "config.gpuk8s.bak").read_text() == OTHERS
    assert stat.S_IMODE(kc.stat().st_mode) == 0o600
    cfg = yaml.safe_load(merged)
    assert {c["name"] for c in cfg["contexts"]} == {"prod", "lab-gpus"}

    # the new context reaches the lab's API server; the other one does not, a missing one is refused
    cp = lab.host("cp-1")
    cp.write("/root/merged.kubeconfig", merged, 0o600)
    got = cp.exec("kubectl --kubeconfig /root/merged.kubeconfig --context lab-gpus get nodes -o json")
    assert {n["metadata"]["name"] for n in json.loads(got.stdout)["items"]} == {"cp-1", "gpu-1"}
    prod = cp.exec("kubectl --kubeconfig /root/merged.kubeconfig get nodes -o json", check=False)
    assert prod.returncode != 0 and "prod.invalid:6443" in prod.stderr  # current-context stays prod
    nope = cp.exec("kubectl --kubeconfig /root/merged.kubeconfig --context nope get nodes", check=False)
    assert "context was not found for specified context: nope" in nope.stderr

    # merged again: nothing to write
    r = run_cli("kubeconfig", "-i", str(lab.inventory), "-o", "json", "--merge", "--context", "lab-gpus",
                "--out", str(kc))
    assert json.loads(r.stdout)["status"] == "unchanged" and kc.read_text() == merged
