"""The sources each host must reach during install (preflight's net.sources): the package repositories, the
registries of every image the cluster runs (gpuk8s/kube/images.py) and, on control planes, the CNI manifest;
decided once per run (SourcePlan) and asked per host."""

from __future__ import annotations

import shlex

from gpuk8s import mirrors
from gpuk8s.gpuplan import is_gpu_node
from gpuk8s.inventory.model import Host, Inventory
from gpuk8s.kube.images import needed_images
from gpuk8s.mirrors import Source


def _registry_url(host: str, insecure: bool) -> str:
    api = "registry-1.docker.io" if host == mirrors.DOCKER_HUB else host
    return f"{'http' if insecure else 'https'}://{api}/v2/"


class SourcePlan:
    """The sources every host of one inventory is checked against, decided once per run. The registries come
    from every image the cluster runs (needed_images renders every manifest, tens of ms of CPU), which depends on
    the inventory only; a host adds the toolkit repository (GPU nodes) and the CNI manifest (control planes).
    Preflight builds one plan per run and asks it per host (it did the whole work twice per host before)."""

    def __init__(self, inv: Inventory) -> None:
        self._inv = inv
        r = mirrors.registry_settings(inv)
        self._registries: list[Source] = []
        seen: set[str] = set()
        for n in needed_images(inv):
            reg = mirrors.parse(n.image).registry
            if reg in seen:
                continue
            seen.add(reg)
            mine = reg in mirrors.own_hosts(r)
            self._registries.append(Source(f"the registry {reg}" + (" (the inventory's mirror)" if mine else ""),
                                           _registry_url(reg, r.insecure_http and mine),
                                           "registry.mirror (or registry.overrides)"))
        self._by_kind: dict[tuple[bool, bool], list[Source]] = {}

    def for_host(self, host: Host) -> list[Source]:
        """What this host fetches from during install, in the order install needs them: the package repositories,
        the image registries (the mirror and overrides where set, else the registries of the images gpuk8s runs)
        and, on control planes, the CNI manifest."""
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
                out.append(Source(f"the {inv.cluster.cni} manifest", mirrors.cni_manifest_url(inv),
                                  "registry.manifests (or install." + inv.cluster.cni + "_manifest)"))
            self._by_kind[kind] = out
        return self._by_kind[kind]

    def prelude(self, host: Host) -> str:
        """The shell assignments put in front of the fact probe: the URLs its `sources` section asks for, and
        GK_FABRIC where the host's inventory sets fabric: (its `topo` section: nvidia-smi topo -m)."""
        urls = " ".join(s.url for s in self.for_host(host))
        fabric = "GK_FABRIC=1\n" if host.gpu.fabric.enabled and is_gpu_node(host) else ""
        return (f"GK_SOURCES={shlex.quote(urls)}\n" if urls else "") + fabric
