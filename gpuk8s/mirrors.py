"""THE answer to "where does this image (or manifest) come from?" given the inventory's `registry:` block.

Every container image reference and CNI manifest URL gpuk8s writes goes through here: kubeadm's
imageRepository (kube/render.py), containerd's sandbox image and its registry host configuration
(the registry-* steps of playbooks/containerd.yaml), the device plugin, HAMi, the DCGM exporter, Prometheus and Grafana
(kube/manifests.py, kube/monitoring.py), the images inside the CNI manifests and their URLs (phases/cni.py),
and the GPU test image (phases/verify.py). `gpuk8s images` lists what this module decides.

The rule (docs/mirrors.md): an image `REGISTRY/PATH:TAG` is taken from `OVERRIDE/PATH:TAG` where
`registry.overrides` names REGISTRY, else from `MIRROR/PATH:TAG`, else from where it is. Docker Hub's short
names are spelled out first (`nginx` is `docker.io/library/nginx`). kubeadm builds its images the same way
from imageRepository (`REPO/kube-apiserver:vX`), so the mirror holds registry.k8s.io's images at the same
paths (`MIRROR/kube-apiserver`, `MIRROR/coredns/coredns`, `MIRROR/pause`).
"""

from __future__ import annotations

import base64
import os
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from gpuk8s import versions
from gpuk8s.inventory.model import Host, Inventory, RegistrySettings
from gpuk8s.logs import register_secret

# The registries the images gpuk8s installs come from, and the one kubeadm's images come from.
KUBEADM_REGISTRY = "registry.k8s.io"
DOCKER_HUB = "docker.io"
UPSTREAMS = ("registry.k8s.io", "nvcr.io", "docker.io", "quay.io", "ghcr.io")
# Docker Hub's API host: containerd resolves docker.io through it (hosts.toml `server`)
_SERVER = {"docker.io": "https://registry-1.docker.io"}
CERTS_D = "/etc/containerd/certs.d"  # containerd's registry config_path (docs/hosts.md)
_IMAGE_LINE = re.compile(r"^(?P<lead>\s*-?\s*image:\s*)(?P<q>[\"']?)(?P<ref>[^\s\"'#]+)(?P=q)(?P<rest>\s*(#.*)?)$")


@dataclass(frozen=True)
class ImageRef:
    registry: str  # docker.io for Docker Hub's short names
    path: str  # library/nginx, nvidia/k8s-device-plugin
    tag: str  # ":v1" or "@sha256:..." (with its separator), or ""

    def __str__(self) -> str:
        return f"{self.registry}/{self.path}{self.tag}"


def parse(ref: str) -> ImageRef:
    """Split an image reference the way containerd's reference.ParseDockerRef does (docker.io/library/...)."""
    name, tag = ref, ""
    if "@" in name:
        name, digest = name.split("@", 1)
        tag = "@" + digest
    last = name.rsplit("/", 1)[-1]
    if ":" in last:
        name, t = name.rsplit(":", 1)
        tag = f":{t}{tag}"
    first, _, rest = name.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        return ImageRef(first, rest, tag)
    return ImageRef(DOCKER_HUB, name if rest else f"library/{name}", tag)


def _settings(inv: Inventory) -> RegistrySettings:
    return getattr(inv, "registry", RegistrySettings())


def repository(inv: Inventory, registry: str) -> str | None:
    """Where `registry`'s images are taken from (host[:port][/path]), or None: from `registry` itself."""
    r = _settings(inv)
    return r.overrides.get(registry) or r.mirror


def _own_hosts(r: RegistrySettings) -> set[str]:
    return {p.split("/", 1)[0] for p in (r.mirror, *r.overrides.values()) if p}


def image(inv: Inventory, ref: str) -> str:
    """The reference gpuk8s writes for the image `ref` (upstream spelling)."""
    r = _settings(inv)
    if not r.enabled:
        return ref
    p = parse(ref)
    if p.registry in _own_hosts(r) and p.registry not in r.overrides:
        return ref  # already the mirror's (install.verify_image naming it, say)
    repo = repository(inv, p.registry)
    return f"{repo}/{p.path}{p.tag}" if repo else ref


def kubeadm_repository(inv: Inventory) -> str | None:
    """ClusterConfiguration.imageRepository (None: kubeadm's default, registry.k8s.io)."""
    return repository(inv, KUBEADM_REGISTRY)


def rewrite_images(inv: Inventory, text: str) -> str:
    """`text` (YAML manifests) with the value of every `image:` line taken through image()."""
    if not _settings(inv).enabled:
        return text
    out = []
    for line in text.splitlines(keepends=True):
        body = line.rstrip("\r\n")
        m = _IMAGE_LINE.match(body)
        if m:
            body = f"{m['lead']}{m['q']}{image(inv, m['ref'])}{m['q']}{m['rest']}"
            line = body + line[len(line.rstrip("\r\n")):]
        out.append(line)
    return "".join(out)


def images_in(text: str) -> list[str]:
    """The image references of a manifest's `image:` lines, in order, each once."""
    seen: list[str] = []
    for line in text.splitlines():
        m = _IMAGE_LINE.match(line)
        if m and m["ref"] not in seen:
            seen.append(m["ref"])
    return seen


def manifest_url(inv: Inventory, url: str) -> str:
    """Where the manifest at `url` is fetched from: registry.manifests + /HOST/PATH, else `url` itself.

    The layout is what `wget -x URL` (or `--force-directories`) writes below a directory, so a mirror is
    made by running that in the directory the web server serves."""
    base = _settings(inv).manifests
    if not base:
        return url
    return f"{base.rstrip('/')}/{re.sub(r'^[a-z]+://', '', url)}"


def cni_manifest_url(inv: Inventory, cni: str | None = None) -> str:
    """The URL the cluster's CNI manifest is fetched from."""
    name = cni or inv.cluster.cni
    return manifest_url(inv, getattr(inv.install, f"{name}_manifest"))


def cni_images(inv: Inventory, cni: str | None = None) -> list[str]:
    """The images inside the cluster's CNI manifest as applied (version matrix: versions.cni_images)."""
    name = cni or inv.cluster.cni
    return [image(inv, i) for i in versions.cni_images(getattr(inv.install, f"{name}_manifest"))]


# -- credentials ----------------------------------------------------------------------------------------

class CredentialsError(Exception):
    """The mirror's credentials cannot be read; the message names where they were looked for, never a value."""


def credentials(inv: Inventory, environ: dict[str, str] | None = None) -> str | None:
    """user:password for the mirror, from registry.credentials (an environment variable or a local file).

    Registered as a secret (masked wherever gpuk8s shows or logs text), and so is its base64 form, which is
    what reaches the hosts (hosts.toml's Authorization header)."""
    r = _settings(inv)
    env = os.environ if environ is None else environ
    value: str | None = None
    if r.credentials_env:
        value = env.get(r.credentials_env)
        if not value:
            raise CredentialsError(f"registry.credentials.env: ${r.credentials_env} is not set or empty "
                                   "(it must hold user:password for the mirror)")
    elif r.credentials_file:
        path = Path(os.path.expanduser(r.credentials_file))
        try:
            with open(path, encoding="utf-8") as f:
                value = f.read(4096).strip()
        except (OSError, UnicodeDecodeError) as e:
            reason = getattr(e, "strerror", None) or type(e).__name__
            raise CredentialsError(f"registry.credentials.file: cannot read {path}: {reason}") from None
        if not value:
            raise CredentialsError(f"registry.credentials.file: {path} is empty (it must hold user:password)")
    if value is None:
        return None
    register_secret(value)
    if ":" not in value or "\n" in value or "\r" in value:
        raise CredentialsError("registry.credentials: the value is not one line of user:password")
    register_secret(basic(value))
    return value


def basic(creds: str) -> str:
    return base64.b64encode(creds.encode()).decode()


# -- containerd's registry host configuration ---------------------------------------------------------

def _toml(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _mirror_host(repo: str, insecure: bool) -> tuple[str, bool]:
    """hosts.toml's [host."URL"] for a mirror at host[:port][/path], and whether override_path is needed:
    a path is the API root only with override_path (containerd docs/hosts.md, `override_path`)."""
    scheme = "http" if insecure else "https"
    host, _, path = repo.partition("/")
    if not path:
        return f"{scheme}://{host}", False
    return f"{scheme}://{host}/v2/{path}", True


def hosts_toml(inv: Inventory, registry: str, creds: str | None = None) -> str | None:
    """/etc/containerd/certs.d/REGISTRY/hosts.toml: pull and resolve from the mirror, upstream as a fallback.

    None when nothing mirrors `registry`."""
    r = _settings(inv)
    repo = repository(inv, registry)
    if not repo:
        return None
    url, override = _mirror_host(repo, r.insecure_http)
    lines = ["# written by gpuk8s (inventory registry:, docs/mirrors.md)",
             f"server = {_toml(_SERVER.get(registry, 'https://' + registry))}", "",
             f"[host.{_toml(url)}]", '  capabilities = ["pull", "resolve"]']
    if override:
        lines.append("  override_path = true")
    if r.ca_file and not r.insecure_http:
        lines.append(f"  ca = {_toml(r.ca_file)}")
    if creds:
        lines += [f"  [host.{_toml(url)}.header]", f"    Authorization = {_toml('Basic ' + basic(creds))}"]
    return "\n".join(lines) + "\n"


def mirrored_registries(inv: Inventory) -> list[str]:
    """The upstream registries that get a hosts.toml: those gpuk8s's images come from, and every override."""
    r = _settings(inv)
    if not r.enabled:
        return []
    regs = list(UPSTREAMS) if r.mirror else []
    regs += [k for k in r.overrides if k not in regs]
    mine = _own_hosts(r)
    return [g for g in regs if g not in mine]


def hosts_files(inv: Inventory, creds: str | None = None) -> dict[str, str]:
    """{path: content} of every hosts.toml gpuk8s writes on a host."""
    out = {}
    for reg in mirrored_registries(inv):
        text = hosts_toml(inv, reg, creds)
        if text:
            out[f"{CERTS_D}/{reg}/hosts.toml"] = text
    return out


def playbook_context(inv: Inventory) -> dict[str, object]:
    """`registry` as playbooks/containerd.yaml's registry-* steps see it (the credentials read here:
    CredentialsError)."""
    creds = credentials(inv) if _settings(inv).enabled else None
    files = {p: base64.b64encode(t.encode()).decode() for p, t in hosts_files(inv, creds).items()}
    if creds:
        for b64 in files.values():
            register_secret(b64)  # the header inside: a dry run's commands and the logs show *** instead
    return {
        "enabled": _settings(inv).enabled,
        "kubeadm_repository": kubeadm_repository(inv) or "",
        # path -> base64 content: written by gk_put, compared byte for byte by the check
        "hosts": files,
        "secret": bool(creds),
        # with the mirror's Authorization header in them, root alone reads them
        "mode": "0600" if creds else "0644",
    }


# -- what the chosen versions need ---------------------------------------------------------------------

@dataclass(frozen=True)
class NeededImage:
    image: str  # as gpuk8s writes it (the mirror's name where one is configured)
    upstream: str  # where the image is published
    used_by: str  # what runs it


def kubeadm_images(inv: Inventory) -> list[NeededImage]:
    """kubeadm's control-plane images that gpuk8s can name: kube-apiserver, -controller-manager, -scheduler,
    -proxy at the version kubeadm init will run (pin the patch in cluster.kubernetes_version to be exact).
    pause, etcd and coredns are kubeadm's choice per release (`kubeadm config images list`), listed by that
    command with the same imageRepository."""
    v = inv.cluster.kubernetes_version
    exact = v.count(".") == 2
    # kubeadm init runs at the version of the kubeadm installed (phases/init.py): the patch written in the
    # inventory, else the newest one the repository has (the version matrix's latest_patch, as best known)
    version = "v" + (v if exact else versions.kubernetes_or_default(v).latest_patch).lstrip("v")
    used_by = "kubeadm" if exact else f"kubeadm (if {version} is the newest patch the repository installs)"
    out = []
    for comp in ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kube-proxy"):
        up = f"{KUBEADM_REGISTRY}/{comp}:{version}"
        out.append(NeededImage(image(inv, up), up, used_by))
    return out


def _upstream_inventory(inv: Inventory) -> Inventory:
    from dataclasses import replace
    return replace(inv, registry=RegistrySettings())


def _manifest_images(inv: Inventory) -> list[tuple[str, str]]:
    """(upstream image, used by) of the manifests gpuk8s renders for this inventory (as applied, before any
    mirror): the GPU manifests where a node has GPUs, HAMi where a node asks for it, monitoring if enabled."""
    from gpuk8s import gpuplan
    from gpuk8s.kube import manifests
    from gpuk8s.kube import monitoring as mon

    up = _upstream_inventory(inv)
    plans = gpuplan.plans(up)
    out: list[tuple[str, str]] = []
    ms = list(manifests.wanted(up, plans))
    if inv.monitoring.enabled:
        ms += mon.wanted(up, plans, mon.resolve_mode(up, None))
    for m in ms:
        for ref in images_in(m.text):
            out.append((ref, m.name))
    return out


def needed_images(inv: Inventory) -> list[NeededImage]:
    """Every image a cluster of this inventory runs, at the chosen versions, as gpuk8s names it (`gpuk8s
    images`): kubeadm's (those gpuk8s can name), the CNI's, the GPU manifests', monitoring's, the GPU test's."""
    out = kubeadm_images(inv)
    cni = inv.cluster.cni
    for up in versions.cni_images(getattr(inv.install, f"{cni}_manifest")):
        out.append(NeededImage(image(inv, up), up, f"{cni} (CNI manifest)"))
    for up, used_by in _manifest_images(inv):
        out.append(NeededImage(image(inv, up), up, used_by))
    tests = [inv.install.verify_image] if inv.install.verify_image else list(versions.matrix().cuda_test_images)
    for up in tests:
        out.append(NeededImage(image(inv, up), up, "verify (GPU test pod)"))
    seen: set[str] = set()
    unique = []
    for n in out:
        if n.image not in seen:
            seen.add(n.image)
            unique.append(n)
    return unique


# -- the sources a host must reach (preflight net.sources) --------------------------------------------

@dataclass(frozen=True)
class Source:
    what: str  # in words, for the finding's message
    url: str  # what the probe asks for (any HTTP answer counts as reached)
    fix: str  # the inventory key that points gpuk8s elsewhere


def _registry_url(host: str, insecure: bool) -> str:
    api = "registry-1.docker.io" if host == DOCKER_HUB else host
    return f"{'http' if insecure else 'https'}://{api}/v2/"


class SourcePlan:
    """The sources every host of one inventory is checked against, decided once per run. The registries come
    from every image the cluster runs (needed_images renders every manifest, tens of ms of CPU), which depends on
    the inventory only; a host adds the toolkit repository (GPU nodes) and the CNI manifest (control planes).
    Preflight builds one plan per run and asks it per host (it did the whole work twice per host before)."""

    def __init__(self, inv: Inventory) -> None:
        self._inv = inv
        r = _settings(inv)
        self._registries: list[Source] = []
        seen: set[str] = set()
        for n in needed_images(inv):
            reg = parse(n.image).registry
            if reg in seen:
                continue
            seen.add(reg)
            mine = reg in _own_hosts(r)
            self._registries.append(Source(f"the registry {reg}" + (" (the inventory's mirror)" if mine else ""),
                                           _registry_url(reg, r.insecure_http and mine),
                                           "registry.mirror (or registry.overrides)"))
        self._by_kind: dict[tuple[bool, bool], list[Source]] = {}

    def for_host(self, host: Host) -> list[Source]:
        """What this host fetches from during install, in the order install needs them: the package repositories,
        the image registries (the mirror and overrides where set, else the registries of the images gpuk8s runs)
        and, on control planes, the CNI manifest."""
        from gpuk8s.gpuplan import is_gpu_node

        kind = (is_gpu_node(host), host.is_control_plane)
        if kind not in self._by_kind:
            inv = self._inv
            out = []
            if kind[0]:
                out.append(Source("the NVIDIA container toolkit repository", inv.install.toolkit_repo,
                                  "install.toolkit_repo"))
            out.append(Source("the Kubernetes package repository", inv.install.kubernetes_repo,
                              "install.kubernetes_repo"))
            out += self._registries
            if kind[1]:
                out.append(Source(f"the {inv.cluster.cni} manifest", cni_manifest_url(inv),
                                  "registry.manifests (or install." + inv.cluster.cni + "_manifest)"))
            self._by_kind[kind] = out
        return self._by_kind[kind]

    def prelude(self, host: Host) -> str:
        """The shell assignment put in front of the fact probe: the URLs its `sources` section asks for."""
        urls = " ".join(s.url for s in self.for_host(host))
        return f"GK_SOURCES={shlex.quote(urls)}\n" if urls else ""


def sed_rewrites(inv: Inventory) -> list[str]:
    """sed -E expressions that rewrite the `image:` lines of a fetched manifest (the CNI's, on the control plane)
    the way image() does: one per mirrored registry. The values are validated host[:port][/path] names."""
    out = []
    for reg in mirrored_registries(inv):
        repo = repository(inv, reg)
        if repo:
            out.append(f"s#(image:[[:space:]]*[\"']?){re.escape(reg)}/#\\1{repo}/#")
    return out
