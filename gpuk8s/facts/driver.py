"""Parsers of the probe's driver facts (its `driver` section and /proc/driver/nvidia/version): pure, linear in
the text, any text accepted (host data: never a path or a pid, never trusted beyond the fields read).

Real texts these read, with their sources: tests/fixtures/real/driver/ (tests/unit/test_driver_facts.py).
"""

from __future__ import annotations

import re
from typing import Literal

from gpuk8s.facts.model import DriverFacts, PciDevice
from gpuk8s.text import subsections

Flavor = Literal["open", "proprietary"]

# /proc/driver/nvidia/version's first line. The proprietary module: "NVRM version: NVIDIA UNIX x86_64 Kernel Module
# 535.154.05  Thu Dec 28 15:37:48 UTC 2023"; the open one: "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64
# 565.57.01  Release Build  (dvs-builder@...)  <date>" (NVIDIA's README kernel_open.html; the open modules'
# utils.mk GENERATE_NVIDSTRING). The version is the first dotted number after "Kernel Module".
_NVRM = re.compile(r"^NVRM version: NVIDIA UNIX (Open Kernel Module for [A-Za-z0-9_]{1,16}|[A-Za-z0-9_]{1,16} "
                   r"Kernel Module) {1,4}([0-9]{1,4}(?:\.[0-9]{1,4}){1,3})(?: |$)")
_VERSION = re.compile(r"^[0-9]{1,4}(?:\.[0-9]{1,4}){1,3}$")
_SUB = re.compile(r"^@@drv ([a-z]{1,16}) (-?[0-9]{1,9})$")
# lspci -Dnn: "0000:1b:00.0 3D controller [0302]: NVIDIA Corporation GH100 [H100 SXM5 80GB] [10de:2330] (rev a1)"
_LSPCI = re.compile(r"^([0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]) [^\[\]]{0,80}\[([0-9a-fA-F]{4})\]: "
                    r"(?:NVIDIA|nVidia) Corporation (.{0,200}?) ?\[10de:([0-9a-fA-F]{4})\]")
GPU_CLASSES = (0x0300, 0x0302)  # VGA compatible controller, 3D controller
BRIDGE_CLASS = 0x0680  # "Bridge": NVSwitches, and the network function of old nForce chipsets
# NVSwitch device ids, where the host's PCI database may not name them: 10de:1af1 (HGX A100's NVSwitch, as a
# GPU monitoring tool's tests list it) and 10de:22a0-22af (Hopper's: HGX H100/H200 show 22a3, "GH100 [H100
# NVSwitch]"; the open kernel modules' nvswitch driver lists the range). Blackwell's NVSwitches (HGX B200/B300)
# are not PCI devices of the host: they are not seen here (docs/driver.md).
NVSWITCH_IDS = frozenset({0x1AF1, *range(0x22A0, 0x22B0)})
_NVML = re.compile(r"^libnvidia-ml\.so\.([0-9]{1,4}(?:\.[0-9]{1,4}){1,3})$")
_PKG = re.compile(r"^([a-z0-9][a-z0-9+.-]{0,120}) ([0-9A-Za-z.:~+_-]{1,120})$")
MAX_LINES = 4096  # no host lists more devices or packages than this: the rest is not read


def parse_proc_version(text: str) -> tuple[str, Flavor] | None:
    """(version, 'open' | 'proprietary') of the loaded module, from /proc/driver/nvidia/version; None where the
    file is absent (no module loaded) or not NVIDIA's."""
    first = text.lstrip("\n").split("\n", 1)[0][:400].rstrip("\r")
    m = _NVRM.match(first)
    if m is None:
        return None
    flavor: Flavor = "open" if m.group(1).startswith("Open") else "proprietary"
    return m.group(2), flavor


def split_subsections(text: str) -> dict[str, tuple[int, str]]:
    """The `@@drv NAME RC` sub-sections of the probe's driver section: name -> (exit status, output)."""
    return subsections(text, _SUB)


def parse_lspci(text: str) -> tuple[tuple[PciDevice, ...], tuple[PciDevice, ...]]:
    """(GPUs, NVSwitches) among `lspci -Dnn -d 10de:` lines; other NVIDIA functions (audio, USB, old chipsets'
    bridges) are left out."""
    gpus, switches = [], []
    for line in text.split("\n")[:MAX_LINES]:
        m = _LSPCI.match(line[:400])
        if m is None:
            continue
        dev = PciDevice(m.group(1).lower(), int(m.group(2), 16), int(m.group(4), 16), m.group(3).strip())
        if dev.class_id in GPU_CLASSES:
            gpus.append(dev)
        elif dev.class_id == BRIDGE_CLASS and (dev.device_id in NVSWITCH_IDS or "NVSwitch" in dev.name):
            switches.append(dev)
    return tuple(gpus), tuple(switches)


def parse_modinfo(text: str) -> tuple[str | None, str | None]:
    """(version, signer) of the module on disk from `modinfo nvidia`; signer '' where the module is unsigned;
    (None, None) where modinfo found no module."""
    version: str | None = None
    signer = ""
    for line in text.split("\n")[:MAX_LINES]:
        key, sep, value = line.partition(":")
        if not sep:
            continue
        value = value.strip()[:200]
        if key == "version" and _VERSION.match(value):
            version = value
        elif key == "signer":
            signer = value
    return (version, signer) if version is not None else (None, None)


def parse_secure_boot(rc: int, text: str) -> bool | None:
    """mokutil --sb-state: 'SecureBoot enabled' / 'SecureBoot disabled'; anything else (not an EFI system, no
    mokutil) is unknown."""
    first = text.strip().split("\n", 1)[0].strip()
    if first == "SecureBoot enabled":
        return True
    if first == "SecureBoot disabled":
        return False
    return None


def parse_units(text: str) -> tuple[str, str]:
    """`systemctl is-active nvidia-fabricmanager nvidia-persistenced`: one state per line, in that order."""
    lines = [ln.strip() for ln in text.split("\n")[:2]]
    states = [ln if ln in ("active", "inactive", "failed", "activating", "deactivating") else "absent"
              for ln in lines + [""] * (2 - len(lines))]
    return states[0], states[1]


def parse_packages(text: str) -> tuple[tuple[str, str], ...]:
    out = []
    for line in text.split("\n")[:MAX_LINES]:
        m = _PKG.match(line.strip())
        if m is not None:
            out.append((m.group(1), m.group(2)))
    return tuple(out)


def parse_holds(text: str) -> tuple[str, ...]:
    """Held package names: apt-mark showhold's lines, or dnf versionlock.list's entries (NAME-[EPOCH:]VERSION-
    RELEASE.*, comments left out), whose names are kept whole: the checks match them by prefix."""
    out = []
    for line in text.split("\n")[:MAX_LINES]:
        s = line.strip()[:200]
        if s and not s.startswith("#") and re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9+._:*~-]*", s):
            out.append(s)
    return tuple(out)


def parse_driver(section: str, proc_version: str) -> DriverFacts:
    """The probe's `driver` section and /proc/driver/nvidia/version ('' where absent) as DriverFacts."""
    subs = split_subsections(section)
    if not subs:
        return DriverFacts()

    def sub(name: str) -> tuple[int, str]:
        return subs.get(name, (127, ""))

    rc, lspci = sub("lspci")
    gpus, switches = parse_lspci(lspci) if rc == 0 else ((), ())
    loaded = parse_proc_version(proc_version)
    libs = sorted({m.group(1) for ln in sub("nvml")[1].split("\n")[:64] if (m := _NVML.match(ln.strip()))})
    mrc, modinfo = sub("modinfo")
    disk, signer = parse_modinfo(modinfo) if mrc == 0 else (None, None)
    src, sb = sub("secureboot")
    hrc, headers = sub("headers")
    fm, persistenced = parse_units(sub("units")[1])
    return DriverFacts(
        read=True, pci_gpus=gpus, nvswitches=switches, lspci=rc == 0,
        module_version=loaded[0] if loaded else None, module_flavor=loaded[1] if loaded else None,
        libraries=tuple(libs), disk_module_version=disk, module_signer=signer,
        secure_boot=parse_secure_boot(src, sb) if src == 0 else None,
        kernel_headers={"yes": True, "no": False}.get(headers.strip()) if hrc == 0 else None,
        fabric_manager=fm, persistenced=persistenced,
        packages=parse_packages(sub("packages")[1]), held=parse_holds(sub("holds")[1]),
        nouveau_blacklisted=bool(sub("blacklist")[1].strip()),
    )
