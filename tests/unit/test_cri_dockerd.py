"""Docker through cri-dockerd: the pin, inventory keys, playbook, preflight's verdicts and kubeadm's criSocket."""

from __future__ import annotations

import subprocess
from dataclasses import replace

import pytest
import yaml

from gpuk8s import versions
from gpuk8s.facts.model import DockerDaemon, Runtime
from gpuk8s.install.prepare import blocking_checks, playbooks_for
from gpuk8s.inventory.loader import InventoryError, loads
from gpuk8s.inventory.model import Cluster
from gpuk8s.kube import render
from gpuk8s.playbook.model import load_playbook
from gpuk8s.playbook.render import context, render_playbook
from gpuk8s.playbook.script import build_script
from gpuk8s.preflight.host_checks import check_host
from tests.unit.test_checks import HOST, TODAY, by_id, facts

PIN = versions.cri_dockerd()
DOCKER_HOSTS = """
hosts:
  - {name: cp-1, address: 10.0.0.10, role: control-plane}
  - {name: cp-2, address: 10.0.0.11, role: control-plane}
  - {name: gpu-1, address: 10.0.0.21, role: worker, gpus: 8}
"""


def inv(runtime: str = "docker", minor: str | None = None, install: str = ""):
    version = f", kubernetes_version: \"{minor}\"" if minor else ""
    cluster = f"cluster: {{container_runtime: {runtime}{version}}}\n"
    return loads(cluster + DOCKER_HOSTS + install)


def docker_facts(version: str = "24.0.7", arch: str = "x86_64"):
    rel = versions.release(version)
    return facts(docker=Runtime("docker", version, rel, True), arch=arch,
                 docker_daemon=DockerDaemon(True, "nvidia", True, "systemd"))


# -- the pin ---------------------------------------------------------------------------------------------------


def test_the_pin_names_an_archive_per_architecture_with_its_sha256():
    assert PIN.url == f"https://github.com/Mirantis/cri-dockerd/releases/download/v{PIN.version}"
    assert PIN.archive("arm64") == f"cri-dockerd-{PIN.version}.arm64.tgz"
    assert set(PIN.sha256) == {"amd64", "arm64"} and len(set(PIN.sha256.values())) == 2
    assert versions.to_json()["cri_dockerd"]["sha256"] == PIN.sha256


@pytest.mark.parametrize("edit, complaint", [
    ({"version": "v0.3"}, "not a release number"),
    ({"url": "http://github.com/x/v0.3.26"}, "https download directory"),
    ({"sha256": {"amd64": "0" * 64}}, "one sha256"),
    ({"sha256": {"amd64": "0" * 64, "arm64": "XYZ"}}, "one sha256"),
])
def test_a_malformed_cri_dockerd_section_is_refused(edit, complaint):
    d = {"version": PIN.version, "url": PIN.url, "sha256": dict(PIN.sha256), **edit}
    with pytest.raises(versions.MatrixError, match=complaint):
        versions.parse_cri_dockerd({"cri_dockerd": d})


# -- kubeadm is pointed at the socket ----------------------------------------------------------------------------


@pytest.mark.parametrize("minor", ["1.30", None], ids=["v1beta3", "v1beta4"])
@pytest.mark.parametrize("runtime, socket", [("docker", "unix:///var/run/cri-dockerd.sock"),
                                             ("containerd", "unix:///var/run/containerd/containerd.sock")])
def test_init_and_join_configurations_name_the_runtimes_cri_socket(runtime, socket, minor):
    i = inv(runtime, minor)
    api = versions.kubernetes_or_default(i.cluster.kubernetes_version).kubeadm_api
    assert api == ("kubeadm.k8s.io/v1beta3" if minor == "1.30" else "kubeadm.k8s.io/v1beta4")
    init = next(yaml.safe_load_all(render.kubeadm_init_config(i, i.control_planes[0], "v1.30.5", None, None)))
    assert init["apiVersion"] == api and init["nodeRegistration"]["criSocket"] == socket
    for host in (i.host("gpu-1"), i.host("cp-2")):  # a worker, and a control plane joining with a certificate key
        join = yaml.safe_load(render.join_config(i, host, "10.0.0.10:6443", "abcdef.0123456789abcdef",
                                                 "sha256:" + "0" * 64, "k" * 64))
        assert join["apiVersion"] == api and join["kind"] == "JoinConfiguration"
        assert join["nodeRegistration"] == {"name": host.name, "criSocket": socket}
        assert ("controlPlane" in join) == host.is_control_plane
    # `gpuk8s render` shows the same
    out = render.manifests(i)
    assert f"criSocket: {socket}" in out["kubeadm-init.yaml"] and f"criSocket: {socket}" in out[
        "kubeadm-join-worker.yaml"]


# -- preflight ---------------------------------------------------------------------------------------------------


def test_docker_on_a_current_minor_passes_naming_the_cri_dockerd_install_sets_up():
    cluster = Cluster(container_runtime="docker")  # the default minor: no dockershim since 1.24
    r = by_id(check_host(HOST, docker_facts(), cluster, today=TODAY))
    c = r["runtime.kubernetes-compat"]
    assert c.status == "pass", c.message
    assert f"cri-dockerd {PIN.version}" in c.message and "unix:///var/run/cri-dockerd.sock" in c.message
    assert f"Kubernetes {versions.default_minor()}" in c.message and "Docker 24.0.7" in c.message
    assert r["runtime.version"].status == "pass"
    # nothing keeps install from preparing this host
    assert blocking_checks(list(r.values())) == []


def test_docker_below_its_floor_fails_and_blocks_install():
    r = by_id(check_host(HOST, docker_facts("19.03.4"), Cluster(container_runtime="docker"), today=TODAY))
    assert r["runtime.version"].status == "fail" and "19.03.5" in r["runtime.version"].message
    assert [c.id for c in blocking_checks(list(r.values()))] == ["runtime.version"]
    ok = by_id(check_host(HOST, docker_facts("19.03.5"), Cluster(container_runtime="docker"), today=TODAY))
    assert ok["runtime.version"].status == "pass"  # 19.03.5 is the floor itself


def test_docker_where_cri_dockerd_has_no_archive_fails_and_says_why():
    r = by_id(check_host(HOST, docker_facts(arch="ppc64le"), Cluster(container_runtime="docker"), today=TODAY))
    c = r["runtime.kubernetes-compat"]
    assert c.status == "fail" and "ppc64le" in c.message and "amd64 and arm64" in c.message
    assert "cluster.container_runtime: containerd" in c.remedy
    assert "runtime.kubernetes-compat" in [x.id for x in blocking_checks(list(r.values()))]
    arm = by_id(check_host(HOST, docker_facts(arch="aarch64"), Cluster(container_runtime="docker"), today=TODAY))
    assert arm["runtime.kubernetes-compat"].status == "pass"


# -- the inventory keys --------------------------------------------------------------------------------------------


def test_cri_dockerd_defaults_come_from_the_matrix():
    i = inv()
    assert i.install.cri_dockerd_url == PIN.url and i.install.cri_dockerd_sha256 == PIN.sha256


def test_a_mirror_and_a_sha256_override_are_read():
    i = inv(install="install:\n  cri_dockerd_url: http://mirror.lan/cri-dockerd/\n"
                    "  cri_dockerd_sha256: {amd64: \"" + "AB" * 32 + "\"}\n")
    assert i.install.cri_dockerd_url == "http://mirror.lan/cri-dockerd"  # http: the sha256 is checked anyway
    assert i.install.cri_dockerd_sha256 == {"amd64": "ab" * 32, "arm64": PIN.sha256["arm64"]}


@pytest.mark.parametrize("value, says", [
    ("{s390x: \"" + "a" * 64 + "\"}", "'s390x' is not an architecture"),
    ("{amd64: nothex}", "not a sha256 digest"),
    ("\"" + "a" * 64 + "\"", "expected a mapping of architecture: sha256"),
])
def test_a_bad_sha256_override_is_reported_at_its_line(value, says):
    with pytest.raises(InventoryError) as e:
        inv(install=f"install:\n  cri_dockerd_sha256: {value}\n")
    p = next(p for p in e.value.problems if p.severity == "error")
    assert says in p.message and p.key.startswith("install.cri_dockerd_sha256") and p.line == 8 and p.fix


# -- the playbook ----------------------------------------------------------------------------------------------------


def steps(i, f):
    ctx = context(i, i.host("gpu-1"), f)
    return [s for name in playbooks_for(i) for s in render_playbook(load_playbook(name), ctx)]


def test_docker_hosts_get_the_cri_dockerd_playbook_after_docker():
    assert playbooks_for(inv())[-2:] == ["docker", "cri-dockerd"]
    assert "cri-dockerd" not in playbooks_for(inv("containerd"))


@pytest.mark.parametrize("arch, deb", [("x86_64", "amd64"), ("aarch64", "arm64")])
def test_the_archive_of_the_hosts_architecture_is_fetched_and_checked(arch, deb):
    s = {x.name: x for x in steps(inv(), docker_facts(arch=arch))}
    binary = s["cri-dockerd-binary"]
    assert f"url={PIN.url}/cri-dockerd-{PIN.version}.{deb}.tgz" in binary.run
    assert f"want={PIN.sha256[deb]}" in binary.run
    # the sha256 is compared before anything is unpacked
    assert binary.run.index('[ "$got" != "$want" ]') < binary.run.index("tar -xzf")
    assert s["cri-dockerd-socket-unit"].file_path == "/etc/systemd/system/cri-docker.socket"
    assert "ListenStream=%t/cri-dockerd.sock" in s["cri-dockerd-socket-unit"].file_content
    assert "ExecStart=/usr/local/bin/cri-dockerd --container-runtime-endpoint fd://" in s[
        "cri-dockerd-service-unit"].file_content
    flags = s["cri-dockerd-flags"].run
    assert "--network-plugin=cni --pod-infra-container-image=$pause" in flags and "kubeadm config images list" in flags
    assert [x.restarts for x in s.values() if x.playbook == "cri-dockerd"][:4] == ["cri-docker"] * 4


def test_a_mirror_url_reaches_the_script_quoted():
    i = inv(install="install:\n  cri_dockerd_url: http://mirror.lan:8080/cri\n")
    binary = next(x for x in steps(i, docker_facts()) if x.name == "cri-dockerd-binary")
    assert f"url=http://mirror.lan:8080/cri/cri-dockerd-{PIN.version}.amd64.tgz" in binary.run


def test_the_docker_script_is_valid_sh():
    script = build_script(steps(inv(), docker_facts()), owner="test", dry_run=False)
    p = subprocess.run(["sh", "-n"], input=script, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr


def test_an_architecture_without_archive_fails_the_step_with_why():
    f = replace(docker_facts(), arch="ppc64le")
    binary = next(x for x in steps(inv(), f) if x.name == "cri-dockerd-binary")
    assert "want=''" in binary.run and "publishes no archive for this architecture" in binary.run


def test_the_pause_image_follows_the_registry_mirror():
    # an air-gapped Docker node must not pull registry.k8s.io/pause (review: cri-dockerd ignored the mirror)
    plain = next(x for x in steps(inv(), docker_facts()) if x.name == "cri-dockerd-flags")
    assert "--image-repository" not in plain.run + plain.check
    i = inv(install="registry:\n  mirror: registry.example.cn/k8s\n")
    mirrored = next(x for x in steps(i, docker_facts()) if x.name == "cri-dockerd-flags")
    for text in (mirrored.run, mirrored.check):
        assert "kubeadm config images list" in text and "--image-repository registry.example.cn/k8s" in text
