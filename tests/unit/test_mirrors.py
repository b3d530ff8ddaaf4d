"""Mirrors and a private registry (issue 21): the inventory block, the one module that names every image and
manifest URL, what install renders with it (kubeadm, containerd, manifests: only the mirror), `gpuk8s images`
against the rendered manifests, containerd.yaml's registry steps run locally, and credentials never shown."""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
import tomllib
import yaml

from gpuk8s import errors, gpuplan, logs, mirrors, versions
from gpuk8s.facts.model import Runtime
from gpuk8s.inventory.loader import InventoryError, loads
from gpuk8s.kube import images
from gpuk8s.playbook.model import load_playbook
from gpuk8s.playbook.render import context, render_playbook
from gpuk8s.playbook.script import build_script, parse_output
from gpuk8s.preflight import sources
from tests.unit.test_checks import HOST, facts

BASE = """cluster: {kubernetes_version: "1.30", cni: calico}
hosts:
  - {name: cp-1, address: 10.0.0.10, role: control-plane}
  - {name: gpu-1, address: 10.0.0.11, role: worker, gpus: 8}
  - {name: gpu-2, address: 10.0.0.12, role: worker, gpus: 4, gpu_sharing: {strategy: hami, replicas: 4}}
monitoring: {enabled: true, prometheus: deploy, grafana: true}
"""
MIRRORED = BASE + """registry:
  mirror: registry.example.cn/k8s
  overrides: {nvcr.io: registry.example.cn/nvcr}
  manifests: https://files.example.cn/mirror
  credentials: {env: GPUK8S_TEST_REGISTRY_AUTH}
"""
PUBLIC = ("registry.k8s.io", "nvcr.io", "docker.io", "quay.io", "ghcr.io")


def inv(text: str = MIRRORED):
    return loads(text, "inventory.yaml")


def problems(text: str) -> list[str]:
    with pytest.raises(InventoryError) as e:
        loads(text, "inventory.yaml")
    return [str(p) for p in e.value.problems]


# -- the reference rule ---------------------------------------------------------------------------------

@pytest.mark.parametrize("ref,registry,path,tag", [
    ("nginx", "docker.io", "library/nginx", ""),
    ("nginx:1.27", "docker.io", "library/nginx", ":1.27"),
    ("grafana/grafana:13.2.0", "docker.io", "grafana/grafana", ":13.2.0"),
    ("registry.k8s.io/coredns/coredns:v1.11.3", "registry.k8s.io", "coredns/coredns", ":v1.11.3"),
    ("localhost:5000/a/b@sha256:" + "0" * 64, "localhost:5000", "a/b", "@sha256:" + "0" * 64),
    ("nvcr.io/nvidia/cuda:12.2.2-base-ubuntu22.04", "nvcr.io", "nvidia/cuda", ":12.2.2-base-ubuntu22.04"),
])
def test_references_are_split_as_containerd_reads_them(ref, registry, path, tag):
    p = mirrors.parse(ref)
    assert (p.registry, p.path, p.tag) == (registry, path, tag)


def test_every_image_goes_to_its_override_else_the_mirror_else_stays():
    i = inv()
    assert mirrors.image(i, "registry.k8s.io/kube-proxy:v1.30.0") == "registry.example.cn/k8s/kube-proxy:v1.30.0"
    assert mirrors.image(i, "nvcr.io/nvidia/k8s-device-plugin:v0.17.1") == \
        "registry.example.cn/nvcr/nvidia/k8s-device-plugin:v0.17.1"
    assert mirrors.image(i, "busybox") == "registry.example.cn/k8s/library/busybox"
    assert mirrors.image(i, "registry.example.cn/k8s/own:1") == "registry.example.cn/k8s/own:1"  # already there
    assert mirrors.kubeadm_repository(i) == "registry.example.cn/k8s"
    plain = inv(BASE)
    assert mirrors.image(plain, "nvcr.io/nvidia/cuda:1") == "nvcr.io/nvidia/cuda:1"
    assert mirrors.kubeadm_repository(plain) is None
    only = inv(BASE + "registry: {overrides: {nvcr.io: 10.0.0.5:5000/nv}}\n")
    assert mirrors.image(only, "nvcr.io/nvidia/cuda:1") == "10.0.0.5:5000/nv/nvidia/cuda:1"
    assert mirrors.image(only, "quay.io/x/y:1") == "quay.io/x/y:1"


def test_manifest_urls_follow_wget_x_layout_below_the_base():
    i = inv()
    url = i.install.calico_manifest
    assert mirrors.cni_manifest_url(i) == "https://files.example.cn/mirror/" + url.split("://", 1)[1]
    assert mirrors.cni_manifest_url(inv(BASE)) == url


def test_image_lines_are_rewritten_whatever_their_quoting():
    text = ("spec:\n  containers:\n    - image: nvcr.io/a/b:1\n      name: x\n    - name: y\n"
            "      image: \"docker.io/c/d:2\"  # pinned\n  initContainers: [{name: z, image: e/f:3}]\n"
            "  imagePullPolicy: Always\n")
    out = mirrors.rewrite_images(inv(), text)
    assert "- image: registry.example.cn/nvcr/a/b:1\n" in out
    assert 'image: "registry.example.cn/k8s/c/d:2"  # pinned\n' in out
    assert mirrors.images_in(out) == ["registry.example.cn/nvcr/a/b:1", "registry.example.cn/k8s/c/d:2"]
    assert mirrors.rewrite_images(inv(BASE), text) == text


# -- the inventory block --------------------------------------------------------------------------------

def test_the_block_is_read():
    r = inv().registry
    assert r.mirror == "registry.example.cn/k8s" and r.overrides == {"nvcr.io": "registry.example.cn/nvcr"}
    assert r.credentials_env == "GPUK8S_TEST_REGISTRY_AUTH" and r.credentials_file is None and r.enabled


@pytest.mark.parametrize("block,where,words", [
    ("registry: {mirror: https://registry.example.cn/k8s}", ":7:", "host[:port][/path]"),
    ("registry: {mirror: mirror}", ":7:", "not a registry host name"),
    ("registry: {mirror: r.example.cn/K8s}", ":7:", "lowercase"),
    ("registry:\n  mirror: r.example.cn\n  overrides: {nvidia: r.example.cn/nv}", ":9:", "not a registry host"),
    ("registry:\n  mirror: r.example.cn\n  credentials: user:secret", ":9:", "never written in the inventory"),
    ("registry:\n  mirror: r.example.cn\n  credentials: {env: A, file: /b}", ":9:", "exactly one of env and file"),
    ("registry:\n  mirror: r.example.cn\n  credentials: {password: hunter2}", ":9:", "secrets must not"),
    ("registry:\n  credentials: {env: A}", ":8:", "apply to a mirror"),
    # issue 28 item 11: Basic credentials over plain http, refused at the credentials' line
    ("registry:\n  mirror: '10.0.0.5:5000'\n  insecure_http: true\n  credentials: {env: A}", ":10:",
     "refused with insecure_http"),
    ("registry:\n  mirror: r.example.cn\n  credentials: {file: /a}\n  insecure_http: true", ":9:",
     "over plain http"),
    ("registry:\n  mirror: r.example.cn\n  mirorr: x", ":9:", "did you mean 'mirror'"),
    ("registry:\n  mirror: r.example.cn\n  manifests: 'https://x.cn/$(reboot)'", ":9:", "not a valid URL"),
    ("registry:\n  mirror: r.example.cn\n  ca_file: relative/ca.crt", ":9:", "absolute path"),
    ("install: {calico_manifest: 'https://x.cn/c.yaml'}\nregistry:\n  mirror: r.example.cn\n"
     "  manifests: http://files.lan/m", ":10:", "no sha256 pin"),
])
def test_mistakes_are_reported_with_line_and_fix(block, where, words):
    found = problems(BASE + block + "\n")
    hit = [p for p in found if words in p]
    assert hit, found
    assert hit[0].startswith("inventory.yaml" + where) and "fix:" in hit[0]
    assert "hunter2" not in " ".join(found) and "user:secret" not in " ".join(found)


def test_plain_http_manifests_mirror_is_accepted_for_a_pinned_manifest():
    i = inv(BASE + "registry: {mirror: r.example.cn, manifests: 'http://files.lan/m', insecure_http: true}\n")
    assert i.registry.manifests == "http://files.lan/m" and i.registry.insecure_http
    assert mirrors.manifest_sha256(i, "calico")  # the default URL's pin still checks the mirrored file


# -- credentials -----------------------------------------------------------------------------------------

CANARY = "mirror-user:Canary-Pw-5c1e7b"


def test_credentials_come_from_the_environment_or_a_file_and_are_masked(tmp_path, monkeypatch):
    i = inv()
    with pytest.raises(errors.CredentialError) as e:
        mirrors.credentials(i, {})
    assert "GPUK8S_TEST_REGISTRY_AUTH" in str(e.value)
    assert mirrors.credentials(i, {"GPUK8S_TEST_REGISTRY_AUTH": CANARY}) == CANARY
    assert CANARY not in logs.mask(f"pulling with {CANARY}")
    assert mirrors.basic(CANARY) not in logs.mask("Authorization = Basic " + mirrors.basic(CANARY))
    f = tmp_path / "auth"
    f.write_text("not-a-pair\n")
    fi = replace(i, registry=replace(i.registry, credentials_env=None, credentials_file=str(f)))
    with pytest.raises(errors.CredentialError) as e:
        mirrors.credentials(fi)
    assert "not-a-pair" not in str(e.value) and "user:password" in str(e.value)
    with pytest.raises(errors.CredentialError) as e:
        mirrors.credentials(replace(fi, registry=replace(fi.registry, credentials_file=str(tmp_path / "none"))))
    assert "cannot read" in str(e.value)


# -- containerd's registry host configuration ---------------------------------------------------------

def test_hosts_toml_puts_the_mirror_first_with_its_path_as_the_api_root():
    i = inv()
    files = mirrors.hosts_files(i, CANARY)
    assert sorted(files) == sorted(f"/etc/containerd/certs.d/{r}/hosts.toml" for r in PUBLIC)
    docker = tomllib.loads(files["/etc/containerd/certs.d/docker.io/hosts.toml"])
    assert docker["server"] == "https://registry-1.docker.io"
    host = docker["host"]["https://registry.example.cn/v2/k8s"]
    assert host["capabilities"] == ["pull", "resolve"] and host["override_path"] is True
    assert host["header"]["Authorization"] == "Basic " + base64.b64encode(CANARY.encode()).decode()
    nv = tomllib.loads(files["/etc/containerd/certs.d/nvcr.io/hosts.toml"])
    assert list(nv["host"]) == ["https://registry.example.cn/v2/nvcr"] and nv["server"] == "https://nvcr.io"
    plain = inv(BASE + "registry: {mirror: '10.0.0.5:5000', insecure_http: true}\n")
    k8s = tomllib.loads(mirrors.hosts_files(plain)["/etc/containerd/certs.d/registry.k8s.io/hosts.toml"])
    assert k8s["host"] == {"http://10.0.0.5:5000": {"capabilities": ["pull", "resolve"]}}
    assert mirrors.hosts_files(inv(BASE)) == {}


def _containerd_2x(f):
    return replace(f, containerd=Runtime("containerd", "containerd github.com/containerd/containerd/v2 v2.2.1 x",
                                         (2, 2, 1), True))


V2_CONFIG = """version = 2
[plugins]
  [plugins."io.containerd.grpc.v1.cri"]
    sandbox_image = "registry.k8s.io/pause:3.8"
    [plugins."io.containerd.grpc.v1.cri".registry]
      config_path = ""
"""
V3_CONFIG = """version = 3
[plugins]
  [plugins.'io.containerd.cri.v1.images']
    snapshotter = 'overlayfs'
    [plugins.'io.containerd.cri.v1.images'.pinned_images]
      sandbox = 'registry.k8s.io/pause:3.10'
    [plugins.'io.containerd.cri.v1.images'.registry]
      config_path = ''
"""


def _containerd_17(f):
    return replace(f, containerd=Runtime("containerd", "containerd github.com/containerd/containerd 1.7.12 x",
                                         (1, 7, 12), True))


@pytest.mark.parametrize("config,f", [(V2_CONFIG, lambda: _containerd_17(facts())),
                                      (V3_CONFIG, lambda: _containerd_2x(facts()))])
def test_registry_playbook_converges_locally_and_is_idempotent(config, f, tmp_path):
    """containerd.yaml's registry steps run by sh against a scratch /etc/containerd: hosts.toml
    written (0600: it carries the header), config_path set, the sandbox image kubeadm names from the mirror."""
    i = inv()
    os.environ["GPUK8S_TEST_REGISTRY_AUTH"] = CANARY
    try:
        ctx = context(i, HOST, f())
    finally:
        del os.environ["GPUK8S_TEST_REGISTRY_AUTH"]
    steps = [s for s in render_playbook(load_playbook("containerd"), ctx) if s.name.startswith("registry-")]
    assert [s.name for s in steps] == ["registry-hosts", "registry-config-path", "registry-sandbox-image"]
    root = tmp_path
    (root / "etc/containerd").mkdir(parents=True)
    (root / "etc/containerd/config.toml").write_text(config)
    bin_ = root / "bin"
    bin_.mkdir()
    # kubeadm: what `kubeadm config images list --image-repository R` prints (its pause line is what matters)
    (bin_ / "kubeadm").write_text('#!/bin/sh\n[ "$1" = version ] && { echo v1.30.0; exit 0; }\n'
                                  'r=registry.k8s.io; while [ $# -gt 0 ]; do [ "$1" = --image-repository ] && '
                                  'r=$2; shift; done\necho "$r/kube-proxy:v1.30.0"; echo "$r/pause:3.9"\n')
    (bin_ / "kubeadm").chmod(0o755)
    script = build_script(steps, owner="unit test", dry_run=False).replace(
        "/var/lib/gpuk8s", str(root / "state")).replace("/etc/containerd", str(root / "etc/containerd")).replace(
        "export PATH=", f"export PATH={bin_}:")
    env = dict(os.environ)

    def run() -> list[str]:
        p = subprocess.run(["sh", "-c", script], capture_output=True, text=True, env=env)
        assert p.returncode == 0, p.stdout + p.stderr
        return [s.status for s in parse_output(p.stdout).steps.values()]

    assert run() == ["changed"] * 3
    cfg = tomllib.loads((root / "etc/containerd/config.toml").read_text())
    plugins = cfg["plugins"]
    if cfg["version"] == 2:
        cri = plugins["io.containerd.grpc.v1.cri"]
        assert cri["sandbox_image"] == "registry.example.cn/k8s/pause:3.9"
        assert cri["registry"]["config_path"] == f"{root}/etc/containerd/certs.d"
    else:
        images = plugins["io.containerd.cri.v1.images"]
        assert images["pinned_images"]["sandbox"] == "registry.example.cn/k8s/pause:3.9"
        assert images["registry"]["config_path"] == f"{root}/etc/containerd/certs.d"
    hosts = root / "etc/containerd/certs.d/nvcr.io/hosts.toml"
    assert oct(hosts.stat().st_mode & 0o777) == "0o600"
    assert tomllib.loads(hosts.read_text())["host"]["https://registry.example.cn/v2/nvcr"]["capabilities"] == [
        "pull", "resolve"]
    assert run() == ["unchanged"] * 3
    assert CANARY not in script  # only its base64 form travels, inside the file's base64 content
    # and what a dry run or a log shows of the script has the whole file masked
    shown = logs.mask(script)
    assert "gk_put" in shown and all(b64 not in shown for b64 in ctx["registry"]["hosts"].values())


def test_no_registry_no_step():
    assert not [s for s in render_playbook(load_playbook("containerd"), context(inv(BASE), HOST, facts()))
                if s.name.startswith("registry-")]


def test_registry_steps_come_before_the_nvidia_runtime_step():
    # on containerd 1.x the toolkit's drop-in replaces the whole CRI table: CRI edits must precede nvidia-ctk
    names = [s.name for s in load_playbook("containerd").steps]
    assert max(names.index(n) for n in names if n.startswith("registry-")) < names.index("nvidia-runtime")


# -- what install renders names only the mirror --------------------------------------------------------

def _rendered(i) -> dict[str, str]:
    from gpuk8s.kube import monitoring, render

    out = dict(render.manifests(i))
    out.update(monitoring.rendered(i, gpuplan.plans(i)))
    return out


def _manifest_images(texts: dict[str, str]) -> set[str]:
    """Every container image of the rendered YAML manifests, read as Kubernetes reads them (not by regex)."""
    found: set[str] = set()

    def walk(o: object) -> None:
        if isinstance(o, dict):
            for k in ("containers", "initContainers"):
                for c in o.get(k) or []:
                    found.add(c["image"])
            for v in o.values():
                walk(v)
        elif isinstance(o, list):
            for v in o:
                walk(v)

    for name, text in texts.items():
        if name.endswith((".yaml", ".yml")):
            for doc in yaml.safe_load_all(text):
                walk(doc)
    return found


def test_rendered_kubeadm_config_and_manifests_name_only_the_mirror():
    i = inv()
    texts = _rendered(i)
    cc = next(d for d in yaml.safe_load_all(texts["kubeadm-init.yaml"]) if d["kind"] == "ClusterConfiguration")
    assert cc["imageRepository"] == "registry.example.cn/k8s"
    # coredns: kubeadm's own rule for a repository not its default, REPO/coredns:TAG (what `kubeadm config
    # images list --image-repository REPO` prints, and what gpuk8s images tells to mirror)
    assert "imageRepository" not in cc.get("dns", {})
    images = _manifest_images(texts)
    assert len(images) >= 6  # device plugin, HAMi and its kube-scheduler, exporter, Prometheus, Grafana
    assert all(img.startswith("registry.example.cn/") for img in images), images
    for name, text in texts.items():
        for reg in PUBLIC:
            assert not re.search(rf"(image:|imageRepository:)\s*['\"]?{re.escape(reg)}/", text), (name, reg)


def test_images_lists_exactly_the_images_the_manifests_use():
    i = inv()
    listed = images.needed_images(i)
    rendered = _rendered(i)
    test_pod = _manifest_images({"p.yaml": rendered.pop("verify-pod.yaml")})
    addons = {n.image for n in listed if n.used_by.endswith(".yaml")}
    assert addons == _manifest_images(rendered)
    # the GPU test pod's image depends on each node's driver: every candidate is listed
    assert test_pod and test_pod <= {n.image for n in listed if n.used_by.startswith("verify")}
    patch = versions.kubernetes("1.30").latest_patch  # "1.30": kubeadm runs at the newest patch installed
    assert {n.image for n in listed if n.used_by.startswith("kubeadm")} == {
        f"registry.example.cn/k8s/{c}:v{patch}" for c in
        ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kube-proxy")}
    exact = images.kubeadm_images(inv(MIRRORED.replace('"1.30"', '"1.30.5"')))
    assert [n.upstream for n in exact][0] == "registry.k8s.io/kube-apiserver:v1.30.5" and exact[0].used_by == "kubeadm"
    cni = [n for n in listed if "CNI" in n.used_by]
    assert [n.upstream for n in cni] == versions.cni_images(i.install.calico_manifest) and cni
    assert all(n.image.startswith("registry.example.cn/") for n in listed)
    # without a mirror the same images, under their own names
    plain = images.needed_images(inv(BASE))
    assert [n.upstream for n in plain] == [n.upstream for n in listed]
    assert all(n.image == n.upstream for n in plain)


def test_images_command_json(tmp_path):
    import sys

    p = tmp_path / "inventory.yaml"
    p.write_text(MIRRORED)
    r = subprocess.run([sys.executable, "-m", "gpuk8s", "images", "-i", str(p), "-o", "json"], capture_output=True,
                       text=True, env={**os.environ, "GPUK8S_TEST_REGISTRY_AUTH": CANARY})
    assert r.returncode == 0, r.stdout + r.stderr
    data = json.loads(r.stdout)
    assert data["mirror"] == "registry.example.cn/k8s"
    assert "--image-repository registry.example.cn/k8s" in data["kubeadm_list"]
    assert {i["image"] for i in data["images"]} == {n.image for n in images.needed_images(inv())}
    assert CANARY not in r.stdout + r.stderr


def test_cni_manifest_images_are_pinned_for_every_manifest_of_the_matrix():
    for p in versions.matrix().pin_sets().values():
        for pin in (p.calico, p.flannel):
            imgs = versions.cni_images(pin.url)
            assert imgs and all(pin.version in i for i in imgs if "cni-plugin" not in i), (pin.url, imgs)


# -- preflight: net.sources -----------------------------------------------------------------------------

def test_sources_are_the_mirror_and_the_repositories_in_install_order():
    i = inv()
    cp = [s.url for s in sources.SourcePlan(i).for_host(i.host("cp-1"))]
    assert cp[0] == i.install.kubernetes_repo
    assert "https://registry.example.cn/v2/" in cp and not any("registry.k8s.io" in u or "nvcr.io" in u for u in cp)
    assert cp[-1] == mirrors.cni_manifest_url(i)
    gpu = [s.url for s in sources.SourcePlan(i).for_host(i.host("gpu-1"))]
    assert gpu[0] == i.install.toolkit_repo and mirrors.cni_manifest_url(i) not in gpu  # workers fetch no manifest
    plain = [s.url for s in sources.SourcePlan(inv(BASE)).for_host(inv(BASE).host("gpu-1"))]
    assert {"https://registry.k8s.io/v2/", "https://nvcr.io/v2/", "https://quay.io/v2/",
            "https://registry-1.docker.io/v2/"} <= set(plain)
    assert sources.SourcePlan(i).prelude(i.host("cp-1")).startswith("GK_SOURCES='https://")


def test_net_sources_names_the_first_source_it_cannot_reach():
    from gpuk8s.facts.parse import parse_sources
    from gpuk8s.preflight.host_checks import sources_check

    i = inv()
    host = i.host("cp-1")
    urls = [s.url for s in sources.SourcePlan(i).for_host(i.host("cp-1"))]
    lines = [f"0 200 {u}" for u in urls]
    lines[1] = f"6 000 {urls[1]}"
    lines[2] = f"7 000 {urls[2]}"
    text = "\n".join([*lines, "garbage line", "0 200 https://evil.example/ignored", "\x1b[31m0 200 x"])
    got = parse_sources(text)
    assert len(got) == len(urls) + 1
    f = replace(facts(), sources=got)
    wanted = sources.SourcePlan(i).for_host(host)
    c = sources_check(wanted, f)
    assert c.status == "warn" and urls[1] in c.message and "does not resolve" in c.message
    assert "1 more unreachable" in c.message and "evil" not in c.message + " ".join(c.evidence)
    ok = sources_check(wanted, replace(facts(), sources=parse_sources("\n".join(f"0 401 {u}" for u in urls))))
    assert ok.status == "pass"  # any HTTP answer is an answer (a registry's /v2/ says 401)
    none = sources_check(wanted, replace(facts(), sources=parse_sources("\n".join(f"127 000 {u}" for u in urls))))
    assert none.status == "skip" and "curl" in none.message


def test_cni_manifest_images_are_rewritten_on_the_control_plane_as_image_would(tmp_path):
    """The sed expressions cni-apply.sh runs (after the sha256 check) give the names mirrors.image() gives."""
    i = inv()
    text = ("spec:\n  containers:\n    - image: docker.io/calico/node:v3.28.0\n"
            "      image: 'quay.io/calico/cni:v3.31.7'\n    - image: \"ghcr.io/flannel-io/flannel:v0.28.9\"\n"
            "    - image: nvcr.io/nvidia/x:1\n    - name: registry.k8s.io/not-an-image-line\n")
    f = tmp_path / "m.yaml"
    f.write_text(text)
    for e in mirrors.sed_rewrites(i):
        subprocess.run(["sed", "-E", "-i", "-e", e, str(f)], check=True)
    assert f.read_text() == mirrors.rewrite_images(i, text)
    assert "name: registry.k8s.io/not-an-image-line" in f.read_text()
    from gpuk8s.phases import shell

    cmd = shell.command("cni-apply", url="https://x/c.yaml", https=True, sha256="a" * 64, pod_cidr="",
                        rewrites=mirrors.sed_rewrites(i))
    assert cmd.index("sha256sum") < cmd.index("sed -E -i") < cmd.index("apply -f")


def test_preflight_decides_the_sources_once_per_run_not_per_host(monkeypatch):
    """needed_images renders every manifest (the client's largest per-run cost): once for the run, whatever the
    number of hosts; every host still gets the sources of its kind (counted, not timed)."""
    import time

    from gpuk8s.facts.parse import parse_probe
    from gpuk8s.preflight import runner
    from tests.unit.test_parsers_hostile import PROBE  # real output of a real H200 host

    n = 40
    hosts = "\n".join(f"  - {{name: w-{k}, address: 10.0.1.{k}, role: worker, gpus: 2}}" for k in range(n))
    i = inv(BASE.split("hosts:")[0] + "hosts:\n  - {name: cp-1, address: 10.0.0.10, role: control-plane}\n"
            + hosts + "\n")
    calls = {"needed": 0}
    real = images.needed_images

    def counted(x):
        calls["needed"] += 1
        return real(x)

    monkeypatch.setattr(sources, "needed_images", counted)
    preludes: dict[str, str] = {}

    class Dummy:
        def __init__(self, host, password=None):
            self.host = host

        def close(self):
            pass

    def probe(s, prelude="", extra=""):
        preludes[s.host.name] = prelude
        return parse_probe(PROBE), [], time.time(), PROBE

    monkeypatch.setattr(runner, "Session", Dummy)
    monkeypatch.setattr(runner, "probe", probe)
    rep = runner.run_preflight(i, concurrency=4, ignore=set(), sudo_passwords={}, measure_network=False)
    assert len(rep.hosts) == n + 1
    assert calls["needed"] == 1
    assert preludes["w-0"] == preludes[f"w-{n - 1}"] == sources.SourcePlan(i).prelude(i.host("w-0"))
    assert preludes["cp-1"] == sources.SourcePlan(i).prelude(i.host("cp-1")) != preludes["w-0"]
    assert all(any(c.id == "net.sources" for c in h.checks) for h in rep.hosts)


def test_a_plain_http_mirror_gets_a_hosts_toml_of_its_own() -> None:
    """Images named after the mirror (MIRROR/PATH:TAG) are pulled from the mirror itself: containerd reaches a
    registry that has no hosts.toml over https only, so a plain-http mirror's own host gets `server = http://...`
    (and an https mirror none)."""
    files = mirrors.hosts_files(inv(BASE + "registry: {mirror: '10.0.0.5:5480', insecure_http: true}\n"))
    assert files["/etc/containerd/certs.d/10.0.0.5:5480/hosts.toml"].endswith('server = "http://10.0.0.5:5480"\n')
    assert '[host."http://10.0.0.5:5480"]' in files["/etc/containerd/certs.d/registry.k8s.io/hosts.toml"]
    tls = mirrors.hosts_files(inv(BASE + "registry: {mirror: 'r.example.cn'}\n"))
    assert not any("r.example.cn/hosts.toml" in p for p in tls)


def test_a_run_from_a_bundle_reads_every_source_from_the_serving_host() -> None:
    import json as _json

    from gpuk8s.bundle import manifest, site

    m = manifest.parse(_json.dumps({
        "schema_version": 1, "kind": "gpuk8s-bundle", "created_by": "t", "kubernetes": "1.30.5",
        "targets": [{"os": "ubuntu-22.04", "arch": "x86_64", "runtime": "containerd"}], "images": [],
        "repos": {"kubernetes": {"fingerprint": "A" * 40}, "toolkit": {"fingerprint": "B" * 40},
                  "driver": {"fingerprint": "D" * 40}},
        "files": {"manifests/calico.yaml": {"sha256": "c" * 64, "size": 3}}}))
    i = inv(BASE + "registry: {mirror: r.example.cn, credentials: {env: X}}\n")
    s = site.served(i, m, "10.0.0.1")
    assert s.install.kubernetes_repo == "http://10.0.0.1:5480/repos/kubernetes"
    assert s.install.kubernetes_repo_insecure_http and s.install.kubernetes_repo_key_fingerprint == "A" * 40
    assert s.install.toolkit_repo == "http://10.0.0.1:5480/repos/toolkit"
    assert s.install.containerd_repo == i.install.containerd_repo  # the bundle carries none: unchanged
    # NVIDIA's RHEL 8 repository (a managed driver on Alibaba Cloud Linux): the served copy, its key pinned
    assert (s.install.driver_repo, s.install.driver_repo_insecure_http, s.install.driver_repo_key_fingerprint) == (
        "http://10.0.0.1:5480/repos/driver", True, "D" * 40)
    assert (s.install.calico_manifest, s.install.calico_manifest_sha256) == (
        "http://10.0.0.1:5480/manifests/calico.yaml", "c" * 64)
    assert s.registry.mirror == "10.0.0.1:5480" and s.registry.insecure_http
    assert s.registry.credentials_env is None  # the site mirror's credentials never go to the bundle's server
    assert s.cluster.kubernetes_version == "1.30.5" and s.hosts == i.hosts
    plugin = "nvidia/k8s-device-plugin:v0.17.0"
    assert mirrors.image(s, f"nvcr.io/{plugin}") == f"10.0.0.1:5480/{plugin}"
    assert site.endpoint("fd00::1", 5480) == "[fd00::1]:5480"
    assert i.registry.mirror == "r.example.cn" and i.install.kubernetes_repo.startswith("https://")  # unchanged


def test_a_run_from_a_bundle_puts_back_every_source_file_the_playbooks_write() -> None:
    """site.source_files: every apt and dnf source file a playbook writes (a path the playbooks name), and the
    hosts.toml of every registry the served inventory mirrors, the serving host's own among them."""
    from gpuk8s.bundle import manifest, site

    named: set[str] = set()
    for f in Path(__file__).parents[2].joinpath("playbooks").glob("*.yaml"):
        named |= set(re.findall(r"/etc/(?:apt/sources\.list\.d/[\w.-]+\.list|yum\.repos\.d/[\w.-]+\.repo)",
                                f.read_text()))
    assert named and named == set(site.SOURCE_FILES), named ^ set(site.SOURCE_FILES)
    m = manifest.parse(_json_doc())
    files = site.source_files(site.served(inv(BASE), m, "10.0.0.1"))
    assert set(site.SOURCE_FILES) <= set(files)
    assert "/etc/containerd/certs.d/registry.k8s.io/hosts.toml" in files
    assert "/etc/containerd/certs.d/10.0.0.1:5480/hosts.toml" in files  # plain http to the serving host
    # Docker reaches it over plain http through daemon.json's insecure-registries
    assert mirrors.playbook_context(site.served(inv(BASE), m, "10.0.0.1"))["insecure_hosts"] == "10.0.0.1:5480"
    assert mirrors.playbook_context(inv(BASE + "registry: {mirror: r.example.cn}\n"))["insecure_hosts"] == ""


def _json_doc() -> str:
    import json as _json

    return _json.dumps({
        "schema_version": 1, "kind": "gpuk8s-bundle", "created_by": "t", "kubernetes": "1.30.5",
        "targets": [{"os": "ubuntu-22.04", "arch": "x86_64", "runtime": "containerd"}], "images": [],
        "repos": {"kubernetes": {"fingerprint": "A" * 40}}, "files": {}})
