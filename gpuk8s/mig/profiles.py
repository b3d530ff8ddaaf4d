"""MIG profile tables per GPU model and the driver floors for MIG, from public NVIDIA sources.

Profiles: NVIDIA's MIG user guide, "Supported MIG Profiles"
(https://docs.nvidia.com/datacenter/tesla/mig-user-guide/supported-mig-profiles.html): the A100-SXM4-40GB
table, with "for A100-SXM4-80GB, the profile names will change according to the memory proportion"
(1g.10gb ... 7g.80gb); H100-80GB uses the A100-80GB names; H200-141GB 1g.18gb x7, 1g.35gb x4, 2g.35gb x3,
3g.71gb x2, 4g.71gb x1, 7g.141gb x1; A30-24GB 1g.6gb x4, 2g.12gb x2, 4g.24gb x1. The GPU instance profile
IDs are the ones `nvidia-smi mig -lgip` prints for these boards (19 1g, 20 1g+me, 15 1g with two memory
slices, 14 2g, 9 3g, 5 4g, 0 7g on A100/H100/H200); the placements (start slices and size on the memory
axis) are those `nvidia-smi mig -lgipp` lists (MIG user guide, "A100 MIG Profiles" placement diagram).
The SM counts are those the guide's tables give (A100: 14 per slice; H100/H200: 16, 26, 32, 60, 64, 132).

Driver floors: the MIG user guide's "Deployment Considerations" table (see DRIVER_FLOORS).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Profile:
    name: str  # as nvidia-smi prints it after "MIG ": 1g.10gb, 1g.10gb+me
    id: int  # the GPU instance profile ID (nvidia-smi mig -cgi accepts it or the name)
    instances: int  # at most this many on one GPU
    slices: int  # compute slices (the "1g" of 1g.10gb)
    memory_gib: str  # as -lgip prints it
    sm: int
    placements: tuple[int, ...]  # valid start slices on the memory axis
    size: int  # memory slices taken

    @property
    def media(self) -> bool:
        return self.name.endswith("+me")


@dataclass(frozen=True)
class Model:
    key: str  # as nvidia-mig-parted's device filters name the boards: A100-80GB, H200-141GB
    arch: str  # ampere, hopper
    memory_slices: int  # 8 (A100/H100/H200) or 4 (A30)
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
    """The seven profiles of an 8-memory-slice board: sizes = (1g memory, 2g memory, 4g memory) names."""
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


_AMPERE_SM = (14, 14, 28, 42, 56, 98)
_HOPPER_SM = (16, 26, 32, 60, 64, 132)
MODELS: dict[str, Model] = {
    "A100-40GB": Model("A100-40GB", "ampere", 8, 7,
                       _eight(("5gb", "10gb", "20gb"), ("4.75", "9.75", "19.62", "39.50"), _AMPERE_SM)),
    "A100-80GB": Model("A100-80GB", "ampere", 8, 7,
                       _eight(("10gb", "20gb", "40gb"), ("9.75", "19.50", "39.25", "78.50"), _AMPERE_SM)),
    "H100-80GB": Model("H100-80GB", "hopper", 8, 7,
                       _eight(("10gb", "20gb", "40gb"), ("9.75", "19.62", "39.50", "79.25"), _HOPPER_SM)),
    "H200-141GB": Model("H200-141GB", "hopper", 8, 7,
                        _eight(("18gb", "35gb", "71gb"), ("16.50", "32.50", "69.75", "139.62"), _HOPPER_SM)),
    "A30-24GB": Model("A30-24GB", "ampere", 4, 4, (
        _p("1g.6gb", 14, 4, 1, "5.81", 14, (0, 1, 2, 3), 1),
        _p("1g.6gb+me", 21, 1, 1, "5.81", 14, (0, 1, 2, 3), 1),
        _p("2g.12gb", 5, 2, 2, "11.69", 28, (0, 2), 2),
        _p("4g.24gb", 0, 1, 4, "23.44", 56, (0,), 4),
    )),
}

# The lowest driver with MIG per GPU: the MIG user guide, "Deployment Considerations" (R620 edition,
# docs.nvidia.com/datacenter/tesla/mig-user-guide/620/deployment-considerations.html). (release, as shown)
DRIVER_FLOORS: dict[str, tuple[tuple[int, ...], str]] = {
    "A100": ((450, 80, 2), "R450 (450.80.02)"),
    "A30": ((460, 73, 1), "R460 (460.73.01)"),
    "H100": ((525, 85, 12), "R525 (525.85.12)"),
    "H20": ((535, 161, 7), "R535 (535.161.07)"),
    "H200": ((550, 90, 7), "R550 (550.90.07)"),
    "B200": ((570, 133, 20), "R570 (570.133.20)"),
    "GB200": ((570, 133, 20), "R570 (570.133.20)"),
    "B300": ((580, 82, 7), "R580 (580.82.07)"),
}

# GPUs that have MIG (the MIG user guide's "Supported GPUs"); any other name has none.
_MIG_FAMILIES = ("A100", "A30", "H100", "H200", "H20", "GH200", "B200", "GB200", "B300", "RTX PRO 6000 Blackwell")


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
    """The profile table of a GPU from its nvidia-smi name and memory.total (MiB), where gpuk8s knows it."""
    fam = family(gpu_name)
    if fam is None or memory_mib is None:
        return None
    gib = memory_mib / 1024
    if fam == "A100":
        return MODELS["A100-80GB" if gib > 60 else "A100-40GB"]
    if fam == "H100" and 70 <= gib <= 90:
        return MODELS["H100-80GB"]
    if fam == "H200" and gib > 120:
        return MODELS["H200-141GB"]
    if fam == "A30":
        return MODELS["A30-24GB"]
    return None
