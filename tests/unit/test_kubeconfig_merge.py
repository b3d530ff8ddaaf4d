"""Merging the admin kubeconfig into an existing kubeconfig: other entries keep their bytes, a backup is kept,
nothing is written when nothing changes, the context can be named."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
import yaml

from gpuk8s.localfiles import LocalFileError, admin_kubeconfig, merge_kubeconfig

EXISTING = """\
# my clusters: keep this comment
apiVersion: v1
clusters:
- cluster:
    certificate-authority-data: QUFBQQ==
    server: https://prod.example.com:6443   # prod
  name: prod
-   name: "staging"
    cluster: {server: 'https://staging.example.com', insecure-skip-tls-verify: true}
contexts:
  - context:
      cluster: prod
      user: prod-admin
      namespace: team-a
    name: prod
  - name: staging
    context: {cluster: staging, user: staging-user}
current-context: prod
kind: Config
preferences: {}
users:
- name: prod-admin
  user:
    exec:
      apiVersion: client.authentication.k8s.io/v1beta1
      command: aws
      args: ["eks", "get-token"]
- name: staging-user
  user:
    token: |
      not-a-real-token
"""


def admin(server: str = "https://10.0.0.10:6443", key: str = "S0VZ") -> str:
    return admin_kubeconfig(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "kubernetes-admin@kubernetes",
        "clusters": [{"name": "kubernetes", "cluster": {"server": server, "certificate-authority-data": "Q0E="}}],
        "contexts": [{"name": "kubernetes-admin@kubernetes",
                      "context": {"cluster": "kubernetes", "user": "kubernetes-admin"}}],
        "users": [{"name": "kubernetes-admin", "user": {"client-certificate-data": "Q0VSVA==",
                                                         "client-key-data": key}}],
    }))


def in_order(old: str, new: str) -> bool:
    """Every line of `old` is a line of `new`, in the same order (new lines only inserted)."""
    it = iter(new.splitlines(keepends=True))
    return all(any(ln == got for got in it) for ln in old.splitlines(keepends=True))


def test_merge_keeps_every_other_byte_and_a_backup(tmp_path: Path) -> None:
    kc = tmp_path / "config"
    kc.write_text(EXISTING)
    kc.chmod(0o600)
    w = merge_kubeconfig(kc, admin(), "lab", context_as="lab")
    assert w.status == "merged" and "current context still prod" in w.message
    new = kc.read_text()
    # every line of the old file is still there, in the same order (the new entries are inserted between)
    assert in_order(EXISTING, new), new
    assert len(new.splitlines()) == len(EXISTING.splitlines()) + 3 * 4  # three entries, 4 lines each
    cfg = yaml.safe_load(new)
    assert cfg["current-context"] == "prod"
    assert [c["name"] for c in cfg["contexts"]] == ["prod", "staging", "lab"]
    assert [c["name"] for c in cfg["clusters"]] == ["prod", "staging", "lab"]
    assert [u["name"] for u in cfg["users"]] == ["prod-admin", "staging-user", "lab-admin"]
    lab = next(c for c in cfg["contexts"] if c["name"] == "lab")
    assert lab["context"] == {"cluster": "lab", "user": "lab-admin"}
    assert next(c for c in cfg["clusters"] if c["name"] == "lab")["cluster"]["server"] == "https://10.0.0.10:6443"
    backup = tmp_path / "config.gpuk8s.bak"
    assert backup.read_text() == EXISTING
    assert stat.S_IMODE(kc.stat().st_mode) == 0o600 and stat.S_IMODE(backup.stat().st_mode) == 0o600
    assert "S0VZ" not in w.message


def test_merge_again_unchanged_then_new_credentials_replace_only_ours(tmp_path: Path) -> None:
    kc = tmp_path / "config"
    kc.write_text(EXISTING)
    merge_kubeconfig(kc, admin(), "lab", context_as="lab")
    first = kc.read_text()
    backup = (tmp_path / "config.gpuk8s.bak").stat().st_mtime_ns
    assert merge_kubeconfig(kc, admin(), "lab", context_as="lab").status == "unchanged"
    assert kc.read_text() == first and (tmp_path / "config.gpuk8s.bak").stat().st_mtime_ns == backup
    w = merge_kubeconfig(kc, admin(key="TkVXS0VZ"), "lab", context_as="lab")  # renewed certificates
    assert w.status == "merged"
    second = kc.read_text()
    assert in_order(EXISTING, second) and len(second.splitlines()) == len(first.splitlines())
    assert second.count("name: lab-admin") == 1 and ": TkVXS0VZ\n" in second and ": S0VZ\n" not in second
    assert (tmp_path / "config.gpuk8s.bak").read_text() == first


def test_default_context_name_and_a_new_file(tmp_path: Path) -> None:
    kc = tmp_path / "kube" / "config"
    w = merge_kubeconfig(kc, admin(), "lab")
    cfg = yaml.safe_load(kc.read_text())
    assert w.status == "merged" and cfg["current-context"] == "lab-admin@lab"
    assert not (tmp_path / "kube" / "config.gpuk8s.bak").exists()


def test_flow_style_file_is_still_merged_semantically(tmp_path: Path) -> None:
    kc = tmp_path / "config"
    kc.write_text("{apiVersion: v1, kind: Config, clusters: [], users: [], contexts: []}\n")
    merge_kubeconfig(kc, admin(), "lab", context_as="lab")
    cfg = yaml.safe_load(kc.read_text())
    assert [c["name"] for c in cfg["contexts"]] == ["lab"] and cfg["current-context"] == "lab"


def test_bad_context_name_refused(tmp_path: Path) -> None:
    with pytest.raises(LocalFileError):
        merge_kubeconfig(tmp_path / "config", admin(), "lab", context_as="a b;c")
