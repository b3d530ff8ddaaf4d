"""Whether a bundle covers an inventory's hosts: per host, a target of the bundle for its OS release, architecture
and container runtime; where gpuk8s manages its driver, the driver branch the inventory asks for and kernel
modules for the kernel the host runs; and the Kubernetes version the inventory asks for. Each gap names the host
and what is missing, before any change (`gpuk8s bundle verify FILE -i INVENTORY`, and install's preflight once
install reads bundles). Pure: the manifest, the inventory and the hosts' facts in, gaps out."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from gpuk8s import versions
from gpuk8s.bundle.manifest import Manifest, Target
from gpuk8s.driver import rules
from gpuk8s.facts.model import HostFacts
from gpuk8s.gpuplan import is_gpu_node
from gpuk8s.inventory.model import Host, Inventory


@dataclass(frozen=True)
class Gap:
    host: str  # "" for the whole cluster
    what: str  # "kubernetes", "target", "driver-branch", "kernel", "facts"
    message: str

    def to_json(self) -> dict[str, str]:
        return {"host": self.host, "what": self.what, "message": self.message}


def rpm_family(os_release: str) -> bool:
    """Whether a target's OS release ("alinux-3", "ubuntu-22.04") installs from dnf repositories."""
    return not os_release.startswith(("ubuntu-", "debian-"))


def os_name(f: HostFacts) -> str:
    """The bundle's name for a host's OS release: ID-VERSION_ID of /etc/os-release ("ubuntu-22.04", "alinux-3")."""
    return f"{f.os.id}-{f.os.version_id}"


def target_for(m: Manifest, f: HostFacts, runtime: str) -> Target | None:
    return next((t for t in m.targets if t.os == os_name(f) and t.arch == f.arch and t.runtime == runtime), None)


def gaps(m: Manifest, inv: Inventory, facts: Mapping[str, HostFacts | None]) -> list[Gap]:
    """Every gap, cluster first, then host by host in the inventory's order. `facts`: each host's, None for a host
    that could not be read (its OS and kernel unknown: a gap, since nothing proves the bundle serves it)."""
    out = kubernetes_gaps(m, inv)
    for h in inv.hosts:
        out += host_gaps(m, inv, h, facts.get(h.name))
    return out


def kubernetes_gaps(m: Manifest, inv: Inventory) -> list[Gap]:
    """The cluster's own: the Kubernetes version, and the CNI manifest of the inventory's CNI."""
    out = []
    want = inv.cluster.kubernetes_version
    if versions.minor_of(want) != m.minor or (want.count(".") == 2 and want != m.kubernetes):
        out.append(Gap("", "kubernetes", f"the bundle holds Kubernetes {m.kubernetes}; the inventory asks for "
                       f"{want}: build a bundle for it (docs/airgap.md)"))
    cni = inv.cluster.cni
    carried = [p for p in m.files if p.startswith("manifests/")]  # bundle create carries the CNI's manifest
    if carried and f"manifests/{cni}.yaml" not in m.files:
        out.append(Gap("", "cni", f"the bundle holds no {cni} manifest (the inventory's CNI): build the bundle "
                       "with this inventory"))
    return out


def host_gaps(m: Manifest, inv: Inventory, h: Host, f: HostFacts | None) -> list[Gap]:
    """What the bundle lacks for one host (install's preflight check bundle.coverage)."""
    if f is None:
        return [Gap(h.name, "facts", f"{h.name}: its facts could not be read, so whether the bundle serves it "
                    "is unknown")]
    runtime = inv.cluster.container_runtime
    t = target_for(m, f, runtime)
    if t is None:
        have = ", ".join(f"{x.os} {x.arch} {x.runtime}" for x in m.targets)
        return [Gap(h.name, "target", f"{h.name}: {os_name(f)} {f.arch} with {runtime}: the bundle has no "
                    f"packages for it (it serves {have})")]
    return _driver(m, h, f, t)


def managed_branch(h: Host) -> str:
    """The driver branch of a host whose driver gpuk8s manages, "" for any other host (its own driver: nothing of
    a bundle's is installed for it)."""
    if not is_gpu_node(h) or not h.gpu.driver.manage:
        return ""
    return h.gpu.driver.branch or versions.drivers().default_branch


def driver_debs(h: Host, f: HostFacts) -> tuple[str, ...]:
    """What the driver steps install on an Ubuntu host whose driver gpuk8s manages (playbooks/nvidia-driver.yaml
    from gpuk8s/driver/rules.py: the branch's packages of its modules' flavour, then the running kernel's
    precompiled modules, last); () elsewhere, or where its settings do not work on it (preflight says why)."""
    if f.os.family != "debian" or not managed_branch(h):
        return ()
    want = rules.playbook_context(h.gpu.driver, f)
    if not want.get("manage"):
        return ()
    return (*want["packages"], f"{want['modules_prefix']}{f.kernel}")  # type: ignore[misc]


def declared_debs(inv: Inventory, facts: Mapping[str, HostFacts | None], kernels: tuple[str, ...]) -> tuple[str, ...]:
    """The Ubuntu driver packages for hosts bundle create could not read, on the kernels a --target declares: what
    each managed-driver host's steps would install, decided as preflight decides for GPUs it cannot classify (the
    open modules with flavor auto, Turing or newer; the inventory's flavor where it sets one), for each kernel.
    No fabric manager (whether a host has NVSwitches is read, not declared: coverage names it once it is read)."""
    out: set[str] = set()
    for h in inv.hosts:
        if facts.get(h.name) is not None or not managed_branch(h):
            continue
        try:
            rules.check_channel(h.gpu.driver, "debian")
            c = rules.choose(h.gpu.driver, "unknown")
        except rules.DriverRuleError:
            continue  # preflight refuses such a host: nothing is installed for it
        want = rules.ubuntu_packages(c, False)
        out |= {*want["packages"], *(f"{want['modules_prefix']}{k}" for k in kernels)}  # type: ignore[misc]
    return tuple(sorted(out))


def _driver(m: Manifest, h: Host, f: HostFacts, t: Target) -> list[Gap]:
    branch = managed_branch(h)
    if not branch:
        return []
    out = []
    debs = driver_debs(h, f)
    if not rpm_family(t.os) and debs and any(r.role == "driver_apt" for r in m.repos):
        # the bundle carries Ubuntu's archive: exactly what this host's driver steps install must be in it (its
        # branch's packages of its modules' flavour, its kernel's modules), not a branch and a kernel apart
        held = {n.rsplit("/", 1)[1].split("_", 1)[0] for n in m.files
                if n.startswith("repos/driver_apt/") and n.endswith(".deb")}
        *packages, modules = debs
        lacks = [p for p in packages if p not in held]
        if lacks:
            out.append(Gap(h.name, "driver-branch", f"{h.name}: driver branch {branch}: the bundle lacks "
                           f"{', '.join(lacks)}"))
        if modules not in held:
            out.append(Gap(h.name, "kernel", f"{h.name}: kernel {f.kernel}: the bundle has no driver modules for "
                           f"it ({modules}; it has them for {', '.join(t.kernels) or 'no kernel'})"))
        return out
    if branch not in t.driver_branches:
        out.append(Gap(h.name, "driver-branch", f"{h.name}: driver branch {branch} (driver: manage): not in the "
                       f"bundle (it holds {', '.join(t.driver_branches) or 'none'} for {t.os})"))
    # the RPM family builds the open modules by DKMS on the host (its OS archive serves the kernel's headers): no
    # kernel of its own in the bundle
    if not rpm_family(t.os) and f.kernel not in t.kernels:
        out.append(Gap(h.name, "kernel", f"{h.name}: kernel {f.kernel}: the bundle has no driver modules for it "
                       f"(it has them for {', '.join(t.kernels) or 'no kernel'} on {t.os})"))
    return out
