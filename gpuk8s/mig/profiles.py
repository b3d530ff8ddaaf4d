"""MIG profile tables per GPU model and the driver floors for MIG, from public NVIDIA sources and real outputs.

Profiles: NVIDIA's MIG user guide, "Supported MIG Profiles"
(https://docs.nvidia.com/datacenter/tesla/mig-user-guide/supported-mig-profiles.html) gives the names, the
instance counts and the placements; the GPU instance profile IDs, memory sizes and SM counts are those real
`nvidia-smi mig -lgip` tables print (tests/fixtures/real/mig holds them with their sources, and
tests/unit/test_real_corpus_smi.py checks every table below against them). The placements (start slices and
size on the memory axis) are those `nvidia-smi mig -lgipp` lists.

Memory sizes differ between driver branches and boards of one model (A100-40GB 2g.10gb: 9.75 GiB on R450, 9.62
later; A30 4g.24gb: 23.50 on 2022 drivers, 23.44 on R535; RTX PRO 6000 1g.24gb: 23.12 on R575/R580, 23.62 on
R610): each table keeps the reading of one real `-lgip`, named in SOURCES. The host's own `-lgip` (the probe reads
it: gpuk8s/facts/mig.py) is the truth for the host; gpu.mig-profile checks a layout against it.

Driver floors: the MIG user guide's "Deployment Considerations" table (see DRIVER_FLOORS).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Profile:
    name: str  # as nvidia-smi prints it after "MIG ": 1g.10gb, 1g.10gb+me, 1g.24gb+gfx, 1g.24gb-me
    id: int  # the GPU instance profile ID (nvidia-smi mig -cgi accepts it or the name)
    instances: int  # at most this many on one GPU
    slices: int  # compute slices (the "1g" of 1g.10gb)
    memory_gib: str  # as -lgip prints it (one real reading: see SOURCES)
    sm: int
    placements: tuple[int, ...]  # valid start slices on the memory axis
    size: int  # memory slices taken

    @property
    def media(self) -> bool:
        """A variant of a base profile that differs only in its engines: +me, +me.all, +gfx, -me."""
        base = self.name.split(".", 1)[1]
        return "+" in base or "-" in base


@dataclass(frozen=True)
class Model:
    key: str  # as nvidia-mig-parted's device filters name the boards: A100-80GB, H200-141GB
    arch: str  # ampere, hopper, blackwell
    memory_slices: int  # 8 (A100/H100/H200), 4 (A30), 12 (RTX PRO 6000 Blackwell: -lgipp's unit)
    compute_slices: int  # 7 or 4
    profiles: tuple[Profile, ...]

    def profile(self, name: str) -> Profile | None:
        return next((p for p in self.profiles if p.name == name), None)

    @property
    def smallest(self) -> Profile:
        return min((p for p in self.profiles if not p.media), key=lambda p: (p.slices, p.size))


def _p(name: str, pid: int, n: int, g: int, mem: str, sm: int, places: tuple[int, ...], size: int) -> Profile:
    return Profile(name, pid, n, g, mem, sm, places, size)


_ONE = (0, 1, 2, 3, 4, 5, 6)


def _eight(sizes: tuple[str, str, str], mem: tuple[str, ...], sm: tuple[int, ...]) -> tuple[Profile, ...]:
    """The seven profiles of an 8-memory-slice board: sizes = (1g memory, 2g memory, 4g memory) names;
    mem = -lgip's GiB of (1g, 1g with two memory slices and 2g, 3g and 4g, 7g); sm = (1g, 1g with two memory
    slices, 2g, 3g, 4g, 7g)."""
    one, two, four = sizes
    full = {"5gb": "40gb", "10gb": "80gb", "18gb": "141gb", "12gb": "94gb"}[one]
    return (
        _p(f"1g.{one}", 19, 7, 1, mem[0], sm[0], _ONE, 1),
        _p(f"1g.{one}+me", 20, 1, 1, mem[0], sm[0], _ONE, 1),
        _p(f"1g.{two}", 15, 4, 1, mem[1], sm[1], (0, 2, 4, 6), 2),
        _p(f"2g.{two}", 14, 3, 2, mem[1], sm[2], (0, 2, 4), 2),
        _p(f"3g.{four}", 9, 2, 3, mem[2], sm[3], (0, 4), 4),
        _p(f"4g.{four}", 5, 1, 4, mem[2], sm[4], (0,), 4),
        _p(f"7g.{full}", 0, 1, 7, mem[3], sm[5], (0,), 8),
    )


def _rtx_pro_6000() -> tuple[Profile, ...]:
    """RTX PRO 6000 Blackwell (96GB): 4 compute slices on a 12-unit placement grid (-lgipp: 1g {0,3,6,9}:3, 2g
    {0,6}:6, 4g {0}:12), four variants of 1g and three of 2g (+me, +me.all, +gfx, -me)."""
    q, h = (0, 3, 6, 9), (0, 6)
    return (
        _p("1g.24gb", 14, 4, 1, "23.62", 46, q, 3),
        _p("1g.24gb+me", 21, 1, 1, "23.62", 46, q, 3),
        _p("1g.24gb+gfx", 47, 4, 1, "23.62", 46, q, 3),
        _p("1g.24gb+me.all", 65, 1, 1, "23.62", 46, q, 3),
        _p("1g.24gb-me", 67, 4, 1, "23.62", 46, q, 3),
        _p("2g.48gb", 5, 2, 2, "47.38", 94, h, 6),
        _p("2g.48gb+gfx", 35, 2, 2, "47.38", 94, h, 6),
        _p("2g.48gb+me.all", 64, 1, 2, "47.38", 94, h, 6),
        _p("2g.48gb-me", 66, 2, 2, "47.38", 94, h, 6),
        _p("4g.96gb", 0, 1, 4, "95.12", 188, (0,), 12),
        _p("4g.96gb+gfx", 32, 1, 4, "95.12", 188, (0,), 12),
    )


_AMPERE_SM = (14, 14, 28, 42, 56, 98)
_HOPPER_SM = (16, 26, 32, 60, 64, 132)
MODELS: dict[str, Model] = {
    "A100-40GB": Model("A100-40GB", "ampere", 8, 7,
                       _eight(("5gb", "10gb", "20gb"), ("4.75", "9.62", "19.50", "39.25"), _AMPERE_SM)),
    "A100-80GB": Model("A100-80GB", "ampere", 8, 7,
                       _eight(("10gb", "20gb", "40gb"), ("9.50", "19.50", "39.25", "78.50"), _AMPERE_SM)),
    "H100-80GB": Model("H100-80GB", "hopper", 8, 7,
                       _eight(("10gb", "20gb", "40gb"), ("9.75", "19.62", "39.50", "79.25"), _HOPPER_SM)),
    "H100-PCIE-80GB": Model("H100-PCIE-80GB", "hopper", 8, 7,
                            _eight(("10gb", "20gb", "40gb"), ("9.62", "19.50", "39.25", "79.00"),
                                   (14, 14, 30, 46, 62, 114))),
    "H200-141GB": Model("H200-141GB", "hopper", 8, 7,
                        _eight(("18gb", "35gb", "71gb"), ("16.00", "32.25", "69.50", "139.75"), _HOPPER_SM)),
    "A30-24GB": Model("A30-24GB", "ampere", 4, 4, (
        _p("1g.6gb", 14, 4, 1, "5.81", 14, (0, 1, 2, 3), 1),
        _p("1g.6gb+me", 21, 1, 1, "5.81", 14, (0, 1, 2, 3), 1),
        _p("2g.12gb", 5, 2, 2, "11.69", 28, (0, 2), 2),
        _p("4g.24gb", 0, 1, 4, "23.50", 56, (0,), 4),
    )),
    "RTX-PRO-6000-96GB": Model("RTX-PRO-6000-96GB", "blackwell", 12, 4, _rtx_pro_6000()),
}

# Where each table's IDs, memory and SMs come from (the real -lgip; tests/fixtures/real/mig/*.meta for sources).
SOURCES: dict[str, str] = {
    "A100-40GB": "MIG user guide v580, 'Getting Started with MIG', nvidia-smi mig -lgip on an A100-SXM4-40GB "
                 "(tests/fixtures/real/mig/a100-40gb-lgip-mig-user-guide.txt)",
    "A100-80GB": "NVIDIA/mig-parted issue 97 (A100 80GB PCIe, 2024-07): the -lgip rows it quotes in full, 1g.10gb "
                 "9.50, 2g.20gb 19.50, 3g.40gb 39.25; no whole real -lgip of an A100-80GB with a citable source "
                 "was found, so 1g.20gb and 7g.80gb keep the MIG user guide's geometry and 78.50 is unconfirmed",
    "H100-80GB": "H100 SXM5 (NVIDIA H100 80GB HBM3): 9.75/19.62/39.50/79.25 GiB and 16/26/32/60/64/132 SMs as public "
                 "-lgip captures print them (none stored: their repositories could not be named); the SXM values "
                 "differ from the PCIe board's",
    "H100-PCIE-80GB": "Scaleway's H100 PCIe, driver 525.125.06 (tests/fixtures/real/mig/h100-pcie-525-lgip.txt)",
    "H200-141GB": "NVIDIA/mig-parted issue 120 (NVIDIA H200, 2024-09): the -lgip rows it quotes in full, 1g.18gb "
                  "16.00, 1g.35gb 32.25, 3g.71gb and 4g.71gb 69.50, 7g.141gb 139.75 (the table is longer than "
                  "the search tool's excerpt, so it is not stored)",
    "A30-24GB": "an A30, 2022 driver (tests/fixtures/real/mig/a30-lgip-4x1g6gb-used.txt); R535 also lists "
                "2g.12gb+me (ID 6), which this table leaves out",
    "RTX-PRO-6000-96GB": "RTX PRO 6000 Blackwell Server Edition, driver 610.43.02 "
                         "(tests/fixtures/real/mig/rtxpro6000-lgip.txt; -lgipp from the same session)",
}

# The lowest driver with MIG per GPU: the MIG user guide, "Deployment Considerations" (R620 edition,
# docs.nvidia.com/datacenter/tesla/mig-user-guide/620/deployment-considerations.html). (release, as shown)
# A800/H800 are the A100/H100 boards under other names (nvidia-mig-parted's config-default.yaml groups
# "A100-80GB, A800-80GB" and "H100-80GB, H800-80GB" under one device filter); RTX PRO 6000 Blackwell: the
# guide v580's "Getting Started with MIG" prerequisites (R575, >= 575.51.03).
DRIVER_FLOORS: dict[str, tuple[tuple[int, ...], str]] = {
    "A100": ((450, 80, 2), "R450 (450.80.02)"),
    "A800": ((450, 80, 2), "R450 (450.80.02)"),
    "A30": ((460, 73, 1), "R460 (460.73.01)"),
    "H100": ((525, 85, 12), "R525 (525.85.12)"),
    "H800": ((525, 85, 12), "R525 (525.85.12)"),
    "H20": ((535, 161, 7), "R535 (535.161.07)"),
    "H200": ((550, 90, 7), "R550 (550.90.07)"),
    "B200": ((570, 133, 20), "R570 (570.133.20)"),
    "GB200": ((570, 133, 20), "R570 (570.133.20)"),
    "B300": ((580, 82, 7), "R580 (580.82.07)"),
    "RTX PRO 6000 Blackwell": ((575, 51, 3), "R575 (575.51.03)"),
}

# GPUs that have MIG (the MIG user guide's "Supported GPUs", and the A800/H800 variants nvidia-mig-parted
# configures); any other name has none.
_MIG_FAMILIES = ("A100", "A800", "A30", "H100", "H800", "H200", "H20", "GH200", "B200", "GB200", "B300",
                 "GB300", "RTX PRO 6000 Blackwell", "RTX PRO 5000 Blackwell")


def family(gpu_name: str) -> str | None:
    """The MIG-capable family of an nvidia-smi product name (NVIDIA A100-SXM4-80GB -> A100), or None."""
    n = gpu_name.upper().replace("NVIDIA ", "")
    for fam in sorted(_MIG_FAMILIES, key=len, reverse=True):
        f = fam.upper()
        if n == f or n.startswith(f + "-") or n.startswith(f + " ") or n.startswith(f + "_"):
            return fam
    return None


def mig_capable(gpu_name: str) -> bool:
    return family(gpu_name) is not None


def model_for(gpu_name: str, memory_mib: int | None) -> Model | None:
    """The profile table of a GPU from its nvidia-smi name and memory.total (MiB), where gpuk8s knows it; None
    for a MIG-capable board without a table (see no_table_fix)."""
    fam = family(gpu_name)
    if fam is None or memory_mib is None:
        return None
    gib = memory_mib / 1024
    if fam in ("A100", "A800"):
        return MODELS["A100-80GB" if gib > 60 else "A100-40GB"]
    if fam in ("H100", "H800") and 70 <= gib <= 90:
        return MODELS["H100-PCIE-80GB" if "PCIE" in gpu_name.upper() else "H100-80GB"]
    if fam == "H200" and gib > 120:
        return MODELS["H200-141GB"]
    if fam == "A30":
        return MODELS["A30-24GB"]
    if fam == "RTX PRO 6000 Blackwell" and 90 <= gib <= 100:
        return MODELS["RTX-PRO-6000-96GB"]
    return None


def no_table_fix(gpu_name: str) -> str:
    """What to do for a MIG-capable GPU gpuk8s has no profile table for (GH200, B200, GB200, H20, H100 NVL, ...):
    gpuk8s does not guess its geometry."""
    boards = "A100 40/80GB (and A800), A30, H100 80GB SXM and PCIe (and H800), H200 141GB, RTX PRO 6000 Blackwell"
    return (f"gpuk8s plans MIG only where it has the board's profile table ({boards}); for "
            f"{gpu_name or 'this GPU'} remove mig from this host (or its gpu_group): gpuk8s then offers its GPUs "
            "whole (and turns MIG off where it is on). nvidia-mig-parted and the GPU Operator's MIG manager know "
            "more boards; nvidia-smi mig -lgip on the host lists this one's profiles")
