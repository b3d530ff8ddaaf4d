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
from dataclasses import dataclass
from pathlib import Path

from gpuk8s import versions
from gpuk8s.errors import CredentialError
from gpuk8s.inventory.model import Inventory, RegistrySettings
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


def registry_settings(inv: Inventory) -> RegistrySettings:
    return getattr(inv, "registry", RegistrySettings())


def repository(inv: Inventory, registry: str) -> str | None:
    """Where `registry`'s images are taken from (host[:port][/path]), or None: from `registry` itself."""
    r = registry_settings(inv)
    return r.overrides.get(registry) or r.mirror


def own_hosts(r: RegistrySettings) -> set[str]:
    """The registry hosts the inventory names as its own (the mirror's, the overrides')."""
    return {p.split("/", 1)[0] for p in (r.mirror, *r.overrides.values()) if p}


def image(inv: Inventory, ref: str) -> str:
    """The reference gpuk8s writes for the image `ref` (upstream spelling)."""
    r = registry_settings(inv)
    if not r.enabled:
        return ref
    p = parse(ref)
    if p.registry in own_hosts(r) and p.registry not in r.overrides:
        return ref  # already the mirror's (install.verify_image naming it, say)
    repo = repository(inv, p.registry)
    return f"{repo}/{p.path}{p.tag}" if repo else ref


def kubeadm_repository(inv: Inventory) -> str | None:
    """ClusterConfiguration.imageRepository (None: kubeadm's default, registry.k8s.io)."""
    return repository(inv, KUBEADM_REGISTRY)


def rewrite_images(inv: Inventory, text: str) -> str:
    """`text` (YAML manifests) with the value of every `image:` line taken through image()."""
    if not registry_settings(inv).enabled:
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
    base = registry_settings(inv).manifests
    if not base:
        return url
    return f"{base.rstrip('/')}/{re.sub(r'^[a-z]+://', '', url)}"


def cni_manifest_url(inv: Inventory, cni: str | None = None) -> str:
    """The URL the cluster's CNI manifest is fetched from."""
    name = cni or inv.cluster.cni
    return manifest_url(inv, getattr(inv.install, f"{name}_manifest"))


def manifest_sha256(inv: Inventory, cni: str) -> str | None:
    """The sha256 the `cni` ("calico" or "flannel") manifest must have, or None when nothing pins it.

    The inventory's install.<cni>_manifest_sha256 wins; else the pin of the manifest's URL in
    versions.DEFAULT_MANIFEST_SHA256 (for the default URL, or a mirror someone listed there).
    """
    if cni not in ("calico", "flannel"):
        raise ValueError(f"unknown CNI {cni!r}")
    pinned: str | None = getattr(inv.install, f"{cni}_manifest_sha256")
    if pinned:
        return pinned
    url: str = getattr(inv.install, f"{cni}_manifest")
    return versions.DEFAULT_MANIFEST_SHA256.get(url)


def cni_images(inv: Inventory, cni: str | None = None) -> list[str]:
    """The images inside the cluster's CNI manifest as applied (version matrix: versions.cni_images)."""
    name = cni or inv.cluster.cni
    return [image(inv, i) for i in versions.cni_images(getattr(inv.install, f"{name}_manifest"))]


# -- credentials ----------------------------------------------------------------------------------------

def credentials(inv: Inventory, environ: dict[str, str] | None = None) -> str | None:
    """user:password for the mirror, from registry.credentials (an environment variable or a local file).

    Registered as a secret (masked wherever gpuk8s shows or logs text), and so is its base64 form, which is
    what reaches the hosts (hosts.toml's Authorization header)."""
    r = registry_settings(inv)
    env = os.environ if environ is None else environ
    value: str | None = None
    if r.credentials_env:
        value = env.get(r.credentials_env)
        if not value:
            raise CredentialError(f"registry.credentials.env: ${r.credentials_env} is not set or empty "
                                   "(it must hold user:password for the mirror)")
    elif r.credentials_file:
        path = Path(os.path.expanduser(r.credentials_file))
        try:
            with open(path, encoding="utf-8") as f:
                value = f.read(4096).strip()
        except (OSError, UnicodeDecodeError) as e:
            reason = getattr(e, "strerror", None) or type(e).__name__
            raise CredentialError(f"registry.credentials.file: cannot read {path}: {reason}") from None
        if not value:
            raise CredentialError(f"registry.credentials.file: {path} is empty (it must hold user:password)")
    if value is None:
        return None
    register_secret(value)
    if ":" not in value or "\n" in value or "\r" in value:
        raise CredentialError("registry.credentials: the value is not one line of user:password")
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
    r = registry_settings(inv)
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
    r = registry_settings(inv)
    if not r.enabled:
        return []
    regs = list(UPSTREAMS) if r.mirror else []
    regs += [k for k in r.overrides if k not in regs]
    mine = own_hosts(r)
    return [g for g in regs if g not in mine]


def plain_http_toml(host: str) -> str:
    """hosts.toml of a mirror that speaks plain http, for the images named after it (MIRROR/PATH:TAG): containerd
    reaches a registry without a hosts.toml over https only (docs/hosts.md: `server` defaults to https://HOST)."""
    return ("# written by gpuk8s (inventory registry: insecure_http, docs/mirrors.md)\n"
            f"server = {_toml('http://' + host)}\n")


def hosts_files(inv: Inventory, creds: str | None = None) -> dict[str, str]:
    """{path: content} of every hosts.toml gpuk8s writes on a host."""
    out = {}
    for reg in mirrored_registries(inv):
        text = hosts_toml(inv, reg, creds)
        if text:
            out[f"{CERTS_D}/{reg}/hosts.toml"] = text
    r = registry_settings(inv)
    if r.insecure_http:
        for host in sorted(own_hosts(r)):
            out[f"{CERTS_D}/{host}/hosts.toml"] = plain_http_toml(host)
    return out


def playbook_context(inv: Inventory) -> dict[str, object]:
    """`registry` as playbooks/containerd.yaml's registry-* steps see it (the credentials read here:
    CredentialError)."""
    creds = credentials(inv) if registry_settings(inv).enabled else None
    files = {p: base64.b64encode(t.encode()).decode() for p, t in hosts_files(inv, creds).items()}
    if creds:
        for b64 in files.values():
            register_secret(b64)  # the header inside: a dry run's commands and the logs show *** instead
    return {
        "enabled": registry_settings(inv).enabled,
        "kubeadm_repository": kubeadm_repository(inv) or "",
        # Docker reaches a registry over plain http only where daemon.json's insecure-registries names it
        "insecure_hosts": ",".join(sorted(own_hosts(registry_settings(inv)))) if registry_settings(inv).insecure_http
        else "",
        # path -> base64 content: written by gk_put, compared byte for byte by the check
        "hosts": files,
        "secret": bool(creds),
        # with the mirror's Authorization header in them, root alone reads them
        "mode": "0600" if creds else "0644",
    }


# -- a source a host must reach (preflight net.sources: gpuk8s/preflight/sources.py decides which) ---------

@dataclass(frozen=True)
class Source:
    what: str  # in words, for the finding's message
    url: str  # what the probe asks for (any HTTP answer counts as reached)
    fix: str  # the inventory key that points gpuk8s elsewhere


def sed_rewrites(inv: Inventory) -> list[str]:
    """sed -E expressions that rewrite the `image:` lines of a fetched manifest (the CNI's, on the control plane)
    the way image() does: one per mirrored registry. The values are validated host[:port][/path] names."""
    out = []
    for reg in mirrored_registries(inv):
        repo = repository(inv, reg)
        if repo:
            out.append(f"s#(image:[[:space:]]*[\"']?){re.escape(reg)}/#\\1{repo}/#")
    return out
