"""Rendered kubeadm configurations and manifests, without SSH; manifests validated against Kubernetes schemas."""

from __future__ import annotations

import re
import stat
import subprocess
from dataclasses import replace

import kubernetes_validate
import kubernetes_validate.utils
import pytest
import yaml

from gpuk8s import versions
from gpuk8s.inventory.loader import loads
from gpuk8s.kube import manifests, render

INV = loads("""
cluster: {name: ml, kubernetes_version: "1.30", pod_cidr: 10.32.0.0/16}
hosts:
  - {name: cp-1, address: 10.0.0.10, role: control-plane}
  - {name: cp-2, address: 10.0.0.11, role: control-plane}
  - {name: cp-3, address: 10.0.0.12, role: control-plane}
  - {name: gpu-1, address: 10.0.0.21, role: worker, gpus: 8}
""")


# The Kubernetes schemas the installed kubernetes-validate has, as minors ("1.37"). A minor of the version
# matrix newer than all of them is validated against the newest it has (the test's id says so): that is the
# closest check offline; update kubernetes-validate to check it exactly.
SCHEMA_MINORS = sorted({versions.minor_of(v) for v in kubernetes_validate.utils.all_versions()},
                       key=lambda m: int(m.split(".")[1]))


def schema_for(minor: str) -> str:
    if minor in SCHEMA_MINORS:
        return minor
    newest = SCHEMA_MINORS[-1]
    assert int(minor.split(".")[1]) > int(newest.split(".")[1]), f"kubernetes-validate has no schema for {minor}"
    return newest


RENDER_INV = """
cluster: {name: ml, kubernetes_version: "MINOR", pod_cidr: 10.32.0.0/16}
hosts:
  - {name: cp-1, address: 10.0.0.10, role: control-plane}
  - {name: gpu-1, address: 10.0.0.21, role: worker, gpus: 8}
"""


@pytest.mark.parametrize("version", [
    pytest.param(m, id=m if schema_for(m) == m else f"{m}-with-{schema_for(m)}-schemas")
    for m in versions.supported_minors()])
def test_every_rendered_manifest_is_valid_for_every_minor_of_the_matrix(version):
    inv = loads(RENDER_INV.replace('kubernetes_version: "MINOR"', f'kubernetes_version: "{version}"'))
    docs = render.manifests(inv)
    checked = 0
    for name, text in docs.items():
        if not name.endswith(".yaml"):
            continue
        for d in yaml.safe_load_all(text):
            if d["apiVersion"].startswith(("kubeadm.k8s.io", "kubelet.config.k8s.io")):
                assert d["apiVersion"] in (versions.kubernetes(version).kubeadm_api, "kubelet.config.k8s.io/v1beta1")
                continue  # not API objects: checked field by field below
            kubernetes_validate.validate(d, schema_for(version), strict=True)
            checked += 1
    # RuntimeClass, the plugin's ConfigMap, DaemonSet, ServiceAccount, ClusterRole(Binding), MPS daemon, Pod
    assert checked == 8
    # the device plugin of this minor's pins
    image = f"nvcr.io/nvidia/k8s-device-plugin:{versions.pins(version).device_plugin}"
    assert image in docs["nvidia-device-plugin.yaml"]


def test_kubernetes_validate_knows_the_default_minor():
    """The default minor is validated against its own schemas, not a neighbour's."""
    assert versions.default_minor() in SCHEMA_MINORS


def test_the_validator_would_catch_a_mistake():
    bad = next(yaml.safe_load_all(manifests.device_plugin(INV).applied_text()))
    bad["spec"]["template"]["spec"]["tolerations"][0]["effekt"] = "NoSchedule"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, "1.30", strict=True)


def test_kubeadm_init_configuration():
    init, cluster, kubelet = yaml.safe_load_all(
        render.kubeadm_init_config(INV, INV.control_planes[0], "v1.30.5", "abcdef.0123456789abcdef", "k" * 64))
    assert init["apiVersion"] == "kubeadm.k8s.io/v1beta3" and init["kind"] == "InitConfiguration"
    assert init["localAPIEndpoint"]["advertiseAddress"] == "10.0.0.10"
    assert init["nodeRegistration"] == {"name": "cp-1", "criSocket": "unix:///var/run/containerd/containerd.sock"}
    assert init["bootstrapTokens"][0]["token"] == "abcdef.0123456789abcdef" and init["certificateKey"] == "k" * 64
    assert cluster["networking"] == {"podSubnet": "10.32.0.0/16", "serviceSubnet": "10.96.0.0/12"}
    assert cluster["kubernetesVersion"] == "v1.30.5" and cluster["clusterName"] == "ml"
    assert cluster["controlPlaneEndpoint"] == "10.0.0.10:6443"  # three control planes need an endpoint
    assert kubelet["cgroupDriver"] == "systemd"
    bare = render.kubeadm_init_config(INV, INV.control_planes[0], "v1.30.5", None, None)
    assert "bootstrapTokens" not in bare and "certificateKey" not in bare


@pytest.mark.parametrize("minor", versions.supported_minors())
def test_kubeadm_configuration_api_per_minor(minor):
    """v1beta4 from kubeadm 1.31 on (v1beta3 is deprecated there), v1beta3 before; from the matrix."""
    inv = replace(INV, cluster=replace(INV.cluster, kubernetes_version=minor + ".2"))
    want = "kubeadm.k8s.io/v1beta4" if int(minor.split(".")[1]) >= 31 else "kubeadm.k8s.io/v1beta3"
    assert render.api_version(inv) == versions.kubernetes(minor).kubeadm_api == want
    init, cluster, _ = yaml.safe_load_all(render.kubeadm_init_config(inv, inv.control_planes[0],
                                                                      render.full_version(inv), None, None))
    assert init["apiVersion"] == cluster["apiVersion"] == want and cluster["kubernetesVersion"] == f"v{minor}.2"
    for text in (render.join_config(inv, inv.host("gpu-1"), "10.0.0.10:6443", "t", "sha256:x"),
                 render.token_config(inv, "t"), render.upload_certs_config(inv, "k")):
        assert yaml.safe_load(text)["apiVersion"] == want


def test_join_configuration_for_workers_and_control_planes():
    w = yaml.safe_load(render.join_config(INV, INV.host("gpu-1"), "10.0.0.10:6443", "t" * 6 + "." + "u" * 16,
                                          "sha256:" + "0" * 64))
    assert w["discovery"]["bootstrapToken"]["apiServerEndpoint"] == "10.0.0.10:6443"
    assert "controlPlane" not in w and w["nodeRegistration"]["name"] == "gpu-1"
    c = yaml.safe_load(render.join_config(INV, INV.host("cp-2"), "10.0.0.10:6443", "x", "sha256:y", "key"))
    assert c["controlPlane"] == {"localAPIEndpoint": {"advertiseAddress": "10.0.0.11", "bindPort": 6443},
                                 "certificateKey": "key"}


def test_tokens_and_keys_have_kubeadms_format():
    assert re.fullmatch(r"[a-z0-9]{6}\.[a-z0-9]{16}", render.new_token())
    assert render.new_token() != render.new_token()
    assert re.fullmatch(r"[0-9a-f]{64}", render.new_certificate_key())


@pytest.mark.parametrize(("driver", "cuda"), [((580, 159, 4), "13.0"), ((535, 104, 5), "12.2"),
                                               ((525, 60, 13), "12.2"), ((525, 20), "11.8"),
                                               ((470, 82, 1), "11.8"), ((450, 36, 6), "10.1"),
                                               ((418, 87, 1), "10.1"), ((410, 48), "10.1"), (None, "10.1")])
def test_verify_image_runs_on_the_driver(driver, cuda):
    """The newest test image of the matrix whose CUDA the driver runs (CUDA 12 needs 525.60.13, 11.x 450.80.02)."""
    image = render.verify_image(INV, driver)
    assert f"cuda:{cuda}" in image and image in versions.matrix().cuda_test_images
    mine = replace(INV, install=replace(INV.install, verify_image="registry.lan/cuda:12.4.1-base-ubuntu22.04"))
    assert render.verify_image(mine, driver) == "registry.lan/cuda:12.4.1-base-ubuntu22.04"


def test_render_shows_no_secret(run_cli, tmp_path):
    inv = tmp_path / "inv.yaml"
    inv.write_text("hosts:\n  - {name: cp-1, address: 10.0.0.10, role: control-plane}\n"
                   "  - {name: gpu-1, address: 10.0.0.21, role: worker, gpus: 8}\n")
    r = run_cli("render", "-i", str(inv))
    assert r.returncode == 0, r.stderr
    assert "kind: DaemonSet" in r.stdout and "kind: JoinConfiguration" in r.stdout
    assert "<minted at join time>" in r.stdout and not re.search(r"[a-z0-9]{6}\.[a-z0-9]{16}", r.stdout)
    r = run_cli("render", "-i", str(inv), "--output-dir", str(tmp_path / "out"))
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "kubeadm-init.yaml", "kubeadm-join-worker.yaml", "node-labels-taints.sh", "nvidia-device-plugin-configs.yaml",
        "nvidia-device-plugin-mps-control-daemon.yaml", "nvidia-device-plugin.yaml",
        "runtimeclass-nvidia.yaml", "verify-pod.yaml"]


def test_node_commands_quote_and_match_what_install_sets(tmp_path):
    inv = loads("""
hosts:
  - {name: cp-1, address: 10.0.0.10, role: control-plane}
  - name: gpu-1
    address: 10.0.0.21
    gpus: 8
    labels: {example.com/team: vision}
    taints: ["nvidia.com/gpu=present:NoSchedule", "dedicated:NoExecute"]
""")
    text = render.node_commands(inv)
    assert text.splitlines()[3:] == [
        "kubectl label node gpu-1 example.com/team=vision nvidia.com/device-plugin.config=none nvidia.com/gpu.count=8 "
        "nvidia.com/gpu.present=true nvidia.com/gpu.replicas=1 nvidia.com/gpu.sharing-strategy=none --overwrite",
        "kubectl taint node gpu-1 nvidia.com/gpu=present:NoSchedule dedicated:NoExecute --overwrite"]
    script = tmp_path / "n.sh"
    script.write_text(text)
    assert subprocess.run(["sh", "-n", str(script)]).returncode == 0


# -- render --output-dir: written as the kubeconfig is (issue 28 item 10) --------------------------------------

def test_output_dir_files_are_written_without_following_a_link(tmp_path):
    # another local user who made the directory first could point a manifest's name at the operator's ~/.bashrc
    from gpuk8s import localfiles

    out, victim = tmp_path / "out", tmp_path / "bashrc"
    victim.write_text("mine\n")
    out.mkdir(mode=0o700)
    (out / "a.yaml").symlink_to(victim)
    with pytest.raises(localfiles.LocalFileError, match="a.yaml is a symbolic link: not followed, nothing written"):
        localfiles.write_into(out, {"b.yaml": "b\n", "a.yaml": "a\n"})
    assert victim.read_text() == "mine\n" and sorted(p.name for p in out.iterdir()) == ["a.yaml"]  # nothing written
    (out / "a.yaml").unlink()
    (out / "a.yaml").mkdir()
    with pytest.raises(localfiles.LocalFileError, match="not a regular file"):
        localfiles.write_into(out, {"a.yaml": "a\n"})
    (out / "a.yaml").rmdir()
    (out / "a.yaml").write_text("old\n")
    got = localfiles.write_into(out, {"a.yaml": "a\n", "b.yaml": "b\n"})
    assert [w.status for w in got] == ["replaced", "created"]
    assert (out / "a.yaml").read_text() == "a\n" and stat.S_IMODE((out / "b.yaml").stat().st_mode) == 0o600
    assert sorted(p.name for p in out.iterdir()) == ["a.yaml", "b.yaml"]  # no temporary file left
    new = tmp_path / "new" / "dir"
    localfiles.write_into(new, {"a.yaml": "a\n"})
    assert stat.S_IMODE(new.stat().st_mode) & 0o077 == 0


@pytest.mark.parametrize("mode", [0o777, 0o1777, 0o770, 0o755 | 0o020, 0o702])
def test_output_dir_writable_by_others_is_refused(tmp_path, mode):
    from gpuk8s import localfiles

    out = tmp_path / "out"
    out.mkdir()
    out.chmod(mode)
    with pytest.raises(localfiles.LocalFileError, match="writable by group or others") as e:
        localfiles.write_into(out, {"a.yaml": "a\n"})
    assert "chmod go-w" in e.value.remedy and list(out.iterdir()) == []


def test_output_dir_of_another_user_is_refused(tmp_path, monkeypatch):
    import os

    from gpuk8s import localfiles

    out = tmp_path / "out"
    out.mkdir(mode=0o755)
    monkeypatch.setattr(os, "geteuid", lambda: out.stat().st_uid + 1)
    with pytest.raises(localfiles.LocalFileError, match="belongs to another user"):
        localfiles.write_into(out, {"a.yaml": "a\n"})
    assert list(out.iterdir()) == []


def test_render_refuses_a_link_in_its_output_dir(run_cli, tmp_path):
    inv = tmp_path / "inv.yaml"
    inv.write_text("hosts:\n  - {name: cp-1, address: 10.0.0.10, role: control-plane}\n")
    out, victim = tmp_path / "out", tmp_path / "bashrc"
    victim.write_text("mine\n")
    out.mkdir(mode=0o700)
    (out / "kubeadm-init.yaml").symlink_to(victim)
    r = run_cli("render", "-i", str(inv), "--output-dir", str(out))
    assert r.returncode == 1 and "kubeadm-init.yaml is a symbolic link: not followed" in r.stderr, r.stderr
    assert victim.read_text() == "mine\n"
    out.chmod(0o777)
    (out / "kubeadm-init.yaml").unlink()
    r = run_cli("render", "-i", str(inv), "--output-dir", str(out))
    assert r.returncode == 1 and "writable by group or others" in r.stderr and list(out.iterdir()) == []


def test_output_dir_that_is_a_link_is_refused(tmp_path):
    """Another user's /tmp/out pointing at a directory of the operator's own would pass the owner and mode
    checks of the directory it names: the directory itself is never a link."""
    from gpuk8s import localfiles

    mine = tmp_path / "config"
    mine.mkdir(mode=0o700)
    (mine / "a.yaml").write_text("precious\n")
    link = tmp_path / "out"
    link.symlink_to(mine)
    with pytest.raises(localfiles.LocalFileError, match="is a symbolic link: not followed"):
        localfiles.write_into(link, {"a.yaml": "a\n"})
    assert (mine / "a.yaml").read_text() == "precious\n"


def test_a_link_of_another_user_on_the_way_is_refused(tmp_path):
    import os

    from gpuk8s import localfiles

    if os.geteuid() != 0:
        pytest.skip("making a link owned by another user needs root (CI runs as root)")
    mine = tmp_path / "mine"
    (mine / "out").mkdir(parents=True, mode=0o700)
    (mine / "out" / "a.yaml").write_text("precious\n")
    link = tmp_path / "shared"
    link.symlink_to(mine)
    os.lchown(link, 4242, 4242)
    with pytest.raises(localfiles.LocalFileError, match="symbolic link of another user"):
        localfiles.write_into(link / "out", {"a.yaml": "a\n"})
    assert (mine / "out" / "a.yaml").read_text() == "precious\n"
    os.lchown(link, 0, 0)  # root's own link: the system's, followed
    localfiles.write_into(link / "out", {"a.yaml": "a\n"})
    assert (mine / "out" / "a.yaml").read_text() == "a\n"
