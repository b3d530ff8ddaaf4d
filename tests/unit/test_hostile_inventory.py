"""Hostile inventory values: every field that can reach a remote shell rejects shell metacharacters.

Each (field, value) pair is validated on its own; a rejection must point at the line of the value and
say what to write instead. The only fields that accept such values are local file paths, which never
reach a shell; tests/labtests/test_faults.py runs a whole install with them and a canary.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml

from gpuk8s import mirrors
from gpuk8s.inventory import loader

CANARY = "/var/tmp/gpuk8s-canary"
VALUES = [
    f"x;touch {CANARY}", f"$(touch {CANARY})", f"`touch {CANARY}`", f"x' ; touch {CANARY}; '",
    f'x"$(touch {CANARY})"', f"x\ntouch {CANARY}", f"https://example.com/a;touch {CANARY}",
    f"https://example.com/$(touch {CANARY})", f"1.30 && touch {CANARY}", f"v0.17.1|touch {CANARY}",
]
BASE: dict[str, Any] = {
    "cluster": {"name": "lab", "kubernetes_version": "1.30"},
    "ssh": {"user": "gpuk8s", "identity_file": "/tmp/k", "known_hosts": "/tmp/kh"},
    "hosts": [{"name": "cp-1", "address": "10.0.0.1", "role": "control-plane"},
              {"name": "gpu-1", "address": "10.0.0.2", "gpus": 2, "labels": {"team": "a"},
               "taints": ["a=b:NoSchedule"]}],
}
FIELDS = [
    "hosts.0.name", "hosts.1.address", "hosts.1.labels.KEY", "hosts.1.labels.team", "hosts.1.taints.0",
    "hosts.1.ssh.user", "cluster.name", "cluster.kubernetes_version", "cluster.pod_cidr", "cluster.service_cidr",
    "cluster.control_plane_endpoint", "ssh.user", "ssh.sudo.password_env", "ssh.bastion.address",
    "ssh.bastion.user", "install.toolkit_version", "install.toolkit_repo", "install.kubernetes_repo",
    "install.device_plugin_version", "install.calico_manifest", "install.flannel_manifest", "install.verify_image",
    "install.toolkit_repo.url", "install.kubernetes_repo.url", "install.calico_manifest_sha256",
    "install.flannel_manifest_sha256", "install.containerd_version", "install.containerd_repo",
    "install.containerd_repo.url", "hosts.1.mig.config", "install.cri_dockerd_url",
    "install.cri_dockerd_sha256.amd64",
]
FIELDS += ["monitoring.namespace", "monitoring.retention", "monitoring.storage_class", "monitoring.storage_size",
           "monitoring.prometheus_namespace"]
FIELDS += ["hosts.1.gpu_sharing.strategy", "hosts.1.gpu_group", "gpu_defaults.gpu_sharing.strategy"]
# issue 21: the registry block reaches hosts.toml, containerd's config, kubeadm's and curl's command lines
FIELDS += ["registry.mirror", "registry.overrides.localhost", "registry.overrides.KEY", "registry.manifests",
           "registry.ca_file", "registry.credentials.env"]
# review 2: keys that reach a shell or a label too (each was already refused; listed so that it stays so)
FIELDS += ["install.containerd_repo.key_fingerprint", "install.cri_dockerd_sha256.KEY", "gpu_groups.KEY",
           "hosts.1.mig.config.0.mig-devices.KEY"]
LOCAL_PATHS = ["ssh.identity_file", "ssh.known_hosts"]


def with_value(field: str, value: str) -> dict[str, Any]:
    d = copy.deepcopy(BASE)
    if field == "ssh.bastion.address" or field == "ssh.bastion.user":
        d["ssh"]["bastion"] = {"address": "jump.example.com", "user": "ops"}
    if field == "install.containerd_repo.key_fingerprint":
        d["install"] = {"containerd_repo": {"url": "https://mirror.lan/docker"}}
    if field == "gpu_groups.KEY":
        d["gpu_groups"] = {"a": {"gpu_sharing": {"strategy": "time-slicing", "replicas": 2}}}
    if field.startswith("hosts.1.mig.config"):
        d["hosts"][1]["mig"] = {"strategy": "mixed", "config": [{"devices": "all", "mig-devices": {"1g.10gb": 1}}]}
    *path, last = field.split(".")
    cur: Any = d
    for k in path:
        cur = cur[int(k)] if k.isdigit() else cur.setdefault(k, {})
    if last == "KEY":
        cur.clear()
        cur[value] = 1 if path[-1] == "mig-devices" else "a"  # a MIG profile's count
    elif last.isdigit():
        cur[int(last)] = value
    else:
        cur[last] = value
    return d


@pytest.mark.parametrize("value", VALUES)
@pytest.mark.parametrize("field", FIELDS)
def test_metacharacters_are_rejected_with_a_location_and_a_fix(field: str, value: str) -> None:
    text = yaml.safe_dump(with_value(field, value), sort_keys=False)
    with pytest.raises(loader.InventoryError) as e:
        loader.loads(text, "inv.yaml")
    errors = [p for p in e.value.problems if p.severity == "error"]
    assert errors, field
    p = errors[0]
    assert p.line > 0 and p.fix, (field, str(p))
    # the problem points at the line that holds the value: its key, or the value itself in a list or a key
    line = text.splitlines()[p.line - 1]
    last = field.split(".")[-1]
    holds = ("touch" in line or "'x" in line) if last.isdigit() or last == "KEY" else f"{last}:" in line
    assert holds, (field, line, str(p))
    assert CANARY not in str(p.fix)


@pytest.mark.parametrize("value", VALUES[:6])
@pytest.mark.parametrize("field", LOCAL_PATHS)
def test_local_paths_may_hold_metacharacters_they_never_reach_a_shell(field: str, value: str) -> None:
    d = with_value(field, value.replace("\n", " "))
    inv = loader.loads(yaml.safe_dump(d), "inv.yaml")
    assert value.replace("\n", " ") in (inv.ssh.identity_file or "", inv.ssh.known_hosts)


# -- https only: repositories (and the signing keys fetched from them) and CNI manifests ----------------

FP = "0123456789ABCDEF0123456789ABCDEF01234567"
SHA = "0" * 63 + "1"


def install_problems(install: dict[str, Any]) -> tuple[str, list[loader.Problem]]:
    d = copy.deepcopy(BASE)
    d["install"] = install
    text = yaml.safe_dump(d, sort_keys=False)
    with pytest.raises(loader.InventoryError) as e:
        loader.loads(text, "inv.yaml")
    return text, [p for p in e.value.problems if p.severity == "error"]


def install_ok(install: dict[str, Any]) -> loader.Inventory:
    d = copy.deepcopy(BASE)
    d["install"] = install
    return loader.loads(yaml.safe_dump(d, sort_keys=False), "inv.yaml")


@pytest.mark.parametrize("field", ["toolkit_repo", "kubernetes_repo", "driver_repo", "driver_apt_repo"])
def test_http_repository_is_rejected_with_its_line_and_the_fix(field: str) -> None:
    text, errors = install_problems({field: "http://mirror.lan/repo"})
    assert len(errors) == 1
    p = errors[0]
    assert p.file == "inv.yaml" and p.key == f"install.{field}"
    assert text.splitlines()[p.line - 1].strip() == f"{field}: http://mirror.lan/repo"
    assert "plain http" in p.message
    assert "use https://" in p.fix and "insecure_http: true" in p.fix and "key_fingerprint" in p.fix
    assert str(p).startswith(f"inv.yaml:{p.line}:")


@pytest.mark.parametrize("field", ["toolkit_repo", "kubernetes_repo", "driver_repo", "driver_apt_repo"])
def test_http_repository_in_the_mapping_form_still_needs_insecure_http(field: str) -> None:
    text, errors = install_problems({field: {"url": "http://mirror.lan/repo", "key_fingerprint": FP}})
    assert [p.key for p in errors] == [f"install.{field}.url"]
    assert "url: http://mirror.lan/repo" in text.splitlines()[errors[0].line - 1]


@pytest.mark.parametrize("field", ["toolkit_repo", "kubernetes_repo", "driver_repo", "driver_apt_repo"])
def test_insecure_http_without_a_fingerprint_is_rejected(field: str) -> None:
    text, errors = install_problems({field: {"url": "http://mirror.lan/repo", "insecure_http": True}})
    assert [p.key for p in errors] == [f"install.{field}.insecure_http"]
    assert "insecure_http:" in text.splitlines()[errors[0].line - 1]
    assert "key_fingerprint" in errors[0].message and "40 hex" in errors[0].fix


@pytest.mark.parametrize("field", ["toolkit_repo", "kubernetes_repo", "driver_repo", "driver_apt_repo"])
def test_http_with_insecure_http_and_a_fingerprint_is_accepted(field: str) -> None:
    spaced = " ".join(FP[i:i + 4] for i in range(0, 40, 4)).lower()
    inv = install_ok({field: {"url": "http://mirror.lan/repo/", "insecure_http": True, "key_fingerprint": spaced}})
    assert getattr(inv.install, field) == "http://mirror.lan/repo"
    assert getattr(inv.install, f"{field}_insecure_http") is True
    assert getattr(inv.install, f"{field}_key_fingerprint") == FP
    assert not inv.warnings


def test_https_repositories_need_no_opt_out_and_may_pin_a_key() -> None:
    inv = install_ok({"toolkit_repo": "https://mirror.lan/nv",
                      "kubernetes_repo": {"url": "https://mirror.lan/k8s", "key_fingerprint": "0x" + FP}})
    assert inv.install.toolkit_repo == "https://mirror.lan/nv" and inv.install.toolkit_repo_key_fingerprint is None
    assert inv.install.kubernetes_repo == "https://mirror.lan/k8s"
    assert inv.install.kubernetes_repo_key_fingerprint == FP and not inv.install.kubernetes_repo_insecure_http
    inv = install_ok({"toolkit_repo": {"url": "https://mirror.lan/nv", "insecure_http": True}})
    assert [w.key for w in inv.warnings] == ["install.toolkit_repo.insecure_http"]


@pytest.mark.parametrize("value", ["F" * 39, "G" * 40, FP + "0", FP[:-1] + ";", f"$(touch {CANARY})"])
def test_a_bad_fingerprint_is_rejected(value: str) -> None:
    text, errors = install_problems(
        {"toolkit_repo": {"url": "http://mirror.lan/repo", "insecure_http": True, "key_fingerprint": value}})
    assert [p.key for p in errors] == ["install.toolkit_repo.key_fingerprint"]
    assert "key_fingerprint:" in text.splitlines()[errors[0].line - 1]


def test_a_repository_mapping_needs_a_url() -> None:
    _, errors = install_problems({"toolkit_repo": {"insecure_http": True, "key_fingerprint": FP}})
    assert [p.key for p in errors] == ["install.toolkit_repo.url"]


@pytest.mark.parametrize("cni", ["calico", "flannel"])
def test_http_manifest_without_sha256_is_rejected(cni: str) -> None:
    text, errors = install_problems({f"{cni}_manifest": "http://mirror.lan/cni.yaml"})
    assert len(errors) == 1
    p = errors[0]
    assert p.key == f"install.{cni}_manifest" and "cluster-admin" in p.message
    assert text.splitlines()[p.line - 1].strip() == f"{cni}_manifest: http://mirror.lan/cni.yaml"
    assert "use https://" in p.fix and f"{cni}_manifest_sha256" in p.fix


@pytest.mark.parametrize("cni", ["calico", "flannel"])
def test_http_manifest_with_sha256_is_accepted(cni: str) -> None:
    inv = install_ok({f"{cni}_manifest": "http://mirror.lan/cni.yaml", f"{cni}_manifest_sha256": SHA.upper()})
    assert getattr(inv.install, f"{cni}_manifest") == "http://mirror.lan/cni.yaml"
    assert getattr(inv.install, f"{cni}_manifest_sha256") == SHA


@pytest.mark.parametrize("value", ["0" * 63, "z" * 64, "md5:" + "0" * 32, 12345])
def test_a_bad_manifest_sha256_is_rejected(value: object) -> None:
    _, errors = install_problems({"calico_manifest": "http://mirror.lan/c.yaml", "calico_manifest_sha256": value})
    # the bad pin, and the http manifest that is then left without one
    assert sorted(p.key for p in errors) == ["install.calico_manifest", "install.calico_manifest_sha256"]


def test_manifest_pin_comes_from_the_inventory_else_the_matrix(monkeypatch: pytest.MonkeyPatch) -> None:
    from gpuk8s import versions

    shipped = dict(versions.DEFAULT_MANIFEST_SHA256)
    assert all(len(v) == 64 and set(v) <= set("0123456789abcdef") for v in shipped.values())
    inv = install_ok({"calico_manifest_sha256": "sha256:" + SHA})
    assert mirrors.manifest_sha256(inv, "calico") == SHA
    default_flannel = inv.install.flannel_manifest
    monkeypatch.setattr(versions, "DEFAULT_MANIFEST_SHA256", {default_flannel: "f" * 64})
    assert mirrors.manifest_sha256(inv, "flannel") == "f" * 64
    mirrored = install_ok({"flannel_manifest": "https://mirror.lan/kube-flannel.yml"})
    assert mirrors.manifest_sha256(mirrored, "flannel") is None


def test_an_http_manifest_with_an_empty_sha256_is_refused():
    """`calico_manifest_sha256: ~` is no pin: the manifest would be applied as cluster-admin unchecked."""
    _, errors = install_problems({"calico_manifest": "http://mirror.lan/cni.yaml", "calico_manifest_sha256": None})
    assert [p.key for p in errors] == ["install.calico_manifest"]
