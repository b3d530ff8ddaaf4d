"""Every nvidia-smi and MIG parser over the real outputs of tests/fixtures/real/nvidia-smi and .../mig.

Each item names a file of the corpus (real text, copied verbatim from a public source its NAME.meta names), the
parser gpuk8s runs on that command's output, and the reading expected of it, written by hand from the text (not
produced by gpuk8s): a wrong parser fails here. Every file of the two folders is listed once, and every file has
its sidecar with its source, date, component and version and hardware.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuk8s.facts import mig
from gpuk8s.facts.parse import Section, parse_compute_caps, parse_nvidia_smi, parse_probe
from gpuk8s.inventory import loader
from gpuk8s.mig import layout as L
from gpuk8s.mig.profiles import MODELS, SOURCES, model_for
from gpuk8s.preflight.mig_checks import mig_checks

FIX = Path(__file__).resolve().parent.parent / "fixtures"
REAL = FIX / "real"
META_KEYS = ("command", "source", "date", "component", "hardware", "extraction")


def text(rel: str) -> str:
    return (REAL / rel).read_text(encoding="utf-8")


def _lgi(gpu: int, profile: str, pid: int, ids_places: list[tuple[int, str]]) -> list[tuple]:
    return [(gpu, profile, pid, i, p) for i, p in ids_places]


# ---- nvidia-smi mig -lgip: (gpu, name, profile ID, free, total, memory GiB) per profile row
LGIP = {
    "mig/a100-40gb-lgip-mig-user-guide.txt": [
        (0, "1g.5gb", 19, 7, 7, "4.75"), (0, "1g.5gb+me", 20, 1, 1, "4.75"), (0, "1g.10gb", 15, 4, 4, "9.62"),
        (0, "2g.10gb", 14, 3, 3, "9.62"), (0, "3g.20gb", 9, 2, 2, "19.50"), (0, "4g.20gb", 5, 1, 1, "19.50"),
        (0, "7g.40gb", 0, 1, 1, "39.25")],
    "mig/a30-lgip-4x1g6gb-used.txt": [
        (0, "1g.6gb", 14, 0, 4, "5.81"), (0, "1g.6gb+me", 21, 0, 1, "5.81"), (0, "2g.12gb", 5, 0, 2, "11.69"),
        (0, "4g.24gb", 0, 0, 1, "23.50")],
    "mig/h100-pcie-525-lgip.txt": [
        (0, "1g.10gb", 19, 7, 7, "9.62"), (0, "1g.10gb+me", 20, 1, 1, "9.62"), (0, "1g.20gb", 15, 4, 4, "19.50"),
        (0, "2g.20gb", 14, 3, 3, "19.50"), (0, "3g.40gb", 9, 2, 2, "39.25"), (0, "4g.40gb", 5, 1, 1, "39.25"),
        (0, "7g.80gb", 0, 1, 1, "79.00")],
    "mig/rtxpro6000-lgip.txt": [
        (0, "1g.24gb", 14, 4, 4, "23.62"), (0, "1g.24gb+me", 21, 1, 1, "23.62"),
        (0, "1g.24gb+gfx", 47, 4, 4, "23.62"), (0, "1g.24gb+me.all", 65, 1, 1, "23.62"),
        (0, "1g.24gb-me", 67, 4, 4, "23.62"), (0, "2g.48gb", 5, 2, 2, "47.38"), (0, "2g.48gb+gfx", 35, 2, 2, "47.38"),
        (0, "2g.48gb+me.all", 64, 1, 1, "47.38"), (0, "2g.48gb-me", 66, 2, 2, "47.38"),
        (0, "4g.96gb", 0, 1, 1, "95.12"), (0, "4g.96gb+gfx", 32, 1, 1, "95.12")],
    "mig/t4-lgip-no-mig-enabled-devices.txt": [],  # "No MIG-enabled devices found."
}

# ---- nvidia-smi mig -lgi: (gpu, profile, profile ID, instance ID, placement)
LGI = {
    "mig/a100-40gb-lgi-7x1g5gb-mig-k8s.txt": _lgi(0, "1g.5gb", 19, [(7 + n, f"{n}:1") for n in range(7)]),
    "mig/a100-40gb-lgi-2x3g20gb-mig-user-guide.txt": _lgi(0, "3g.20gb", 9, [(1, "4:4"), (2, "0:4")]),
    "mig/a100-40gb-lgi-4-2-1-mig-user-guide.txt": [
        (0, "1g.5gb", 19, 13, "6:1"), (0, "2g.10gb", 14, 5, "4:2"), (0, "4g.20gb", 5, 1, "0:4")],
    "mig/a100-40gb-lgi-3-2-1-1-mig-user-guide.txt": [
        (0, "1g.5gb", 19, 7, "0:1"), (0, "1g.5gb", 19, 8, "1:1"), (0, "2g.10gb", 14, 4, "2:2"),
        (0, "3g.20gb", 9, 2, "4:4")],
    "mig/a100-40gb-lgi-2-1-1-1-1-1-mig-user-guide.txt": _lgi(0, "1g.5gb", 19, [
        (7, "0:1"), (8, "1:1"), (9, "2:1"), (10, "3:1"), (13, "6:1")]) + [(0, "2g.10gb", 14, 5, "4:2")],
    "mig/a30-lgi-4x1g6gb.txt": _lgi(0, "1g.6gb", 14, [(3, "0:1"), (4, "1:1"), (5, "2:1"), (6, "3:1")]),
    "mig/h100-pcie-525-lgi-3g-1g-1g-1g.txt": _lgi(0, "1g.10gb", 19, [(7, "0:1"), (8, "1:1"), (9, "2:1")])
    + [(0, "3g.40gb", 9, 2, "4:4")],
    "mig/rtxpro6000-lgi-2g-1g-1g.txt": [
        (0, "1g.24gb", 14, 5, "6:3"), (0, "1g.24gb", 14, 6, "9:3"), (0, "2g.48gb", 5, 1, "0:6")],
    "mig/rtxpro6000-lgi-4x1g24gb.txt": _lgi(0, "1g.24gb", 14, [(3, "0:3"), (4, "3:3"), (5, "6:3"), (6, "9:3")]),
    "mig/lgi-i3-1g10gb-dra-driver-933.txt": _lgi(3, "1g.10gb", 19, [(7, "0:1"), (8, "1:1"), (12, "5:1")]),
}

# ---- nvidia-smi mig -lci: (gpu, GPU instance ID, profile, CI profile ID, CI ID)
LCI = {
    "mig/a100-40gb-lci-gi1-no-placement-mig-user-guide.txt": [(0, 1, "1c.3g.20gb", 0, n) for n in range(3)],
    "mig/rtxpro6000-lci-4x1g24gb-placement.txt": [(0, gi, "1g.24gb", 0, 0) for gi in (3, 4, 5, 6)],
}

# ---- tables no gpuk8s parser reads (the probe does not run -lcip): a parser given one must refuse it
NOT_PARSED = {"mig/a100-40gb-lcip-gi1-mig-user-guide.txt"}

# ---- errors nvidia-smi mig prints instead of a table (exit status not shown by the source: any non-zero)
MIG_ERRORS = {
    "mig/lci-insufficient-permissions-hami-1044.txt": "Failed to display compute instances: Insufficient Permissions"}


R450 = "MIG-GPU-4200ccc0-2667-d4cb-9137-f932c716232a/"
R450_OP = "MIG-GPU-5c89852c-d268-c3f3-1b07-005d5ae1dc3f/"
MASK = "MIG-0000000{}-0000-0000-0000-00000000000{}"

# ---- nvidia-smi -L: GPU index -> [(MIG device profile, MIG UUID)], in order
LIST: dict[str, dict[int, list[tuple[str, str]]]] = {
    "mig/a100-40gb-r450-list-no-mig.txt": {0: []},
    "mig/a100-40gb-r450-list-7x1g5gb.txt": {0: [("1g.5gb", f"{R450}{n}/0") for n in range(7, 14)]},
    "mig/a100-40gb-r450-list-mixed.txt": {0: [("3g.20gb", R450 + "2/0"), ("2g.10gb", R450 + "3/0"),
                                              ("1g.5gb", R450 + "9/0")]},
    "mig/a100-40gb-list-7x1g5gb-gpu-operator.txt": {
        0: [("1g.5gb", f"{R450_OP}{n}/0") for n in (7, 8, 9, 11, 12, 13, 14)]},
    "mig/a100-40gb-list-2x3g20gb-mig-user-guide.txt": {0: [
        ("3g.20gb", "MIG-c7384736-a75d-5afc-978f-d2f1294409fd"),
        ("3g.20gb", "MIG-a28ad590-3fda-56dd-84fc-0a0b96edc58d")]},
    "mig/h100-80gb-list-7x1g10gb-gpu-operator.txt": {0: [("1g.10gb", u) for u in (
        "MIG-3f6f389f-b0cc-5e5c-8e32-eaa8fd067902", "MIG-35f93699-4b53-5a19-8289-80b8418eec60",
        "MIG-9d14fb21-4ae1-546f-a636-011582899c39", "MIG-0f709664-740c-52b0-ae79-3e4c9ede6d3b",
        "MIG-5d23f73a-d378-50ac-a6f5-3bf5184773bb", "MIG-6cea15c7-8a56-578c-b965-0e73cb6dfc10",
        "MIG-981c86e9-3607-57d7-9426-295347e4b925")]},
    "mig/h100-80gb-list-mixed-gpu-operator.txt": {0: [
        ("3g.40gb", "MIG-7089d0f3-293f-58c9-8f8c-5ea666eedbde"),
        ("2g.20gb", "MIG-56c30729-347f-5dd6-8da0-c3cc59e969e0"),
        ("1g.10gb", "MIG-9d14fb21-4ae1-546f-a636-011582899c39"),
        ("1g.10gb", "MIG-0f709664-740c-52b0-ae79-3e4c9ede6d3b")]},
    "mig/a100-80gb-list-balanced-head10.txt": {
        0: [("3g.40gb", "MIG-dcf43e8e-5d19-5fa8-8b1d-8aaca1e467f0"),
            ("2g.20gb", "MIG-6b84cf06-0978-530f-bea3-dd6108f98ebf"),
            ("1g.10gb", "MIG-3fff3a97-95a9-5046-9053-4c0da3d1add7"),
            ("1g.10gb", "MIG-7a99e994-6607-5d8a-9ab3-ace43cf9bd96")],
        1: [("3g.40gb", "MIG-51872ee5-5410-564e-abd2-27382756d2d4"),
            ("2g.20gb", "MIG-9af7553b-306e-55b4-a8c7-4cdef4066af4"),
            ("1g.10gb", "MIG-3407f5e5-83f9-55c0-abe5-0e2259ac50b1"),
            ("1g.10gb", "MIG-91e26891-6f5b-5ff3-9c66-310e47d6b059")]},
    "mig/a100-80gb-list-srun-3g40gb.txt": {0: [("3g.40gb", "MIG-dcf43e8e-5d19-5fa8-8b1d-8aaca1e467f0")]},
    "mig/a100-80gb-list-srun-1g10gb.txt": {0: [("1g.10gb", "MIG-3fff3a97-95a9-5046-9053-4c0da3d1add7")]},
    "mig/h100-pcie-525-list-3g-1g-1g-1g.txt": {0: [
        ("3g.40gb", "MIG-da06d78f-7534-56a0-a062-62fef012be91"),
        ("1g.10gb", "MIG-8aa1fc52-9818-58ec-bc64-8f0cae121bb4"),
        ("1g.10gb", "MIG-42fa9c93-1430-5ccc-b623-c02fb93b7f5a"),
        ("1g.10gb", "MIG-6d96b431-44ba-5360-80b0-9359561c927d")]},
    "mig/rtxpro6000-list-8-no-mig.txt": {i: [] for i in range(8)},
    "mig/rtxpro6000-list-head1-after-disable.txt": {0: []},
    "mig/t4-list-no-mig.txt": {0: []},
    "mig/a30-515-list-no-mig-gpu-operator-442.txt": {0: []},
    "mig/list-h100-80gb-mig-590.txt": {0: [(p, MASK.format(n, n)) for n, p in enumerate(
        ("3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"))]},
    "mig/list-h200-mig-590.txt": {0: [(p, MASK.format(n, n)) for n, p in enumerate(
        ("1c.3g.71gb", "2c.3g.71gb", "2g.35gb", "1g.18gb", "1g.18gb"))]},
    "mig/list-h200-590.txt": {0: []},
    "mig/list-l40s-595.txt": {0: []},
    "mig/a100-80gb-535-list-7x1g10gb-datadog.txt": {0: [("1g.10gb", u) for u in (
        "MIG-feb88891-0321-5fef-9c87-d4af3b54259e", "MIG-a25704ba-3a06-5299-a795-fd7cf4d13973",
        "MIG-50f1c4c9-1508-5e8d-bb06-d08145b22e01", "MIG-36c795f2-5cf7-55d6-af30-e535e79b7bb6",
        "MIG-3f45d38c-8cee-503e-b806-a1f1bdceedeb", "MIG-96655de9-9525-58f9-a62b-0e4c1cc1c265",
        "MIG-1aae4990-b962-574e-8375-119d6d9b9687")]},
    "mig/a100-80gb-list-4x1g20gb-and-3-whole-telegraf.txt": {
        0: [("1g.20gb", u) for u in (
            "MIG-ce861fb0-a248-58ce-a9a8-f9adbc22a66a", "MIG-a45882f0-9215-5733-a0c1-49286ab31cb5",
            "MIG-f00d722c-f4e1-52c9-aa31-750441ae1bfe", "MIG-930574a9-d43a-5d2b-95da-3e68384c8d6b")],
        1: [], 2: [], 3: []},
    "mig/rtx4070-laptop-566-list-wsl.txt": {0: []},
    "mig/rtx3090-x4-list-gpu-hot.txt": {i: [] for i in range(4)},
    "mig/quadro-rtx4000-x2-535-list-akash-12.txt": {0: [], 1: []},
    "mig/a100-80gb-pcie-530-list-2x3g40gb-toolkit-203.txt": {0: [
        ("3g.40gb", "MIG-0929581a-2be6-5dec-bf34-0954c6c529a6"),
        ("3g.40gb", "MIG-3adbed3a-d03d-549f-a016-ba1fd7359f23")]},
}
# the 8 x 4 listing of the RTX PRO node: its profiles, and the first and the last UUID read by hand
RTX_32 = "mig/rtxpro6000-list-8x4-1g24gb.txt"

# ---- nvidia-smi --version: the CUDA version gpuk8s reads from it
VERSION = {
    "nvidia-smi/version-h100-80gb-mig-590.txt": "13.1",
    "nvidia-smi/version-h100-80gb-590.txt": "13.1",
    "nvidia-smi/version-h200-mig-590.txt": "13.1",
    "nvidia-smi/version-h200-590.txt": "13.1",
    "nvidia-smi/version-l40s-595.txt": "13.2",
    "nvidia-smi/version-rtx4080s-595.txt": "13.2",
    "nvidia-smi/version-rtx2080s-610.txt": "13.3",  # 'CUDA version : Deprecated, ...' and 'CUDA UMD version : 13.3'
    "nvidia-smi/version-rtx2080s-591-windows.txt": "13.1",
    "nvidia-smi/version-rtx2080s-610-windows.txt": "13.3",
    # WSL2: NVIDIA-SMI 565.77.01 and NVML 565.77 over the Windows driver 566.36 ('DRIVER version')
    "nvidia-smi/version-wsl-566-notebookos.txt": "12.7",
}

# ---- nvidia-smi --query-gpu=compute_cap --format=csv,noheader (the probe pipes it through head: status 0)
COMPUTE_CAP = {
    "nvidia-smi/compute-cap-noheader-4gpu-aitemplate-330.txt": ("8.6", "8.6", "8.6", "8.6"),
    "nvidia-smi/compute-cap-not-valid-470-inference-snaps-89.txt": (),
}

# ---- the probe's first nvidia-smi call failing: (exit status to feed, the error gpuk8s must report)
SMI_ERRORS = {
    # nvidia-smi(1): 9 = NVIDIA driver is not loaded
    "nvidia-smi/no-driver-couldnt-communicate-shine-cluster-50.txt": (
        9, "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."),
    "nvidia-smi/no-driver-couldnt-communicate-gcp-33.txt": (
        9, "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."),
    "nvidia-smi/nvml-version-mismatch-465-az-hop-269.txt": (
        18, "Failed to initialize NVML: Driver/library version mismatch"),
    "nvidia-smi/t4-530-no-devices-found.txt": (6, "No devices were found"),
    # the mismatch with the NVML library's version on a second line (550.144, 570.124): the first line is reported
    "nvidia-smi/nvml-version-mismatch-550-library-line-intel-llvm-17614.txt": (
        18, "Failed to initialize NVML: Driver/library version mismatch"),
    "nvidia-smi/nvml-version-mismatch-570-library-line-tinygrad-47.txt": (
        18, "Failed to initialize NVML: Driver/library version mismatch"),
    # the one-line mismatch on the 460 (an unattended upgrade without a reboot) and 470 (Pop!_OS) branches
    "nvidia-smi/nvml-version-mismatch-460-shine-cluster-30.txt": (
        18, "Failed to initialize NVML: Driver/library version mismatch"),
    "nvidia-smi/nvml-version-mismatch-470-pop-os-18.txt": (
        18, "Failed to initialize NVML: Driver/library version mismatch"),
    # nvidia-smi(1): 255 = other error; 15 = the GPU fell off the bus or is otherwise inaccessible
    "nvidia-smi/nvml-unknown-error-510-nvidia-docker-1671.txt": (255, "Failed to initialize NVML: Unknown Error"),
    "nvidia-smi/gpu-lost-device-handle-k8s-device-plugin-231.txt": (
        15, "Unable to determine the device handle for GPU 0000:C1:00.0: GPU is lost."),
}


def all_items() -> set[str]:
    parts = (LGIP, LGI, LCI, LIST, VERSION, COMPUTE_CAP, SMI_ERRORS, MIG_ERRORS)
    return {k for d in parts for k in d} | NOT_PARSED | {RTX_32}


def test_every_file_is_in_the_table_and_has_its_sidecar():
    files = {f"{p.parent.name}/{p.name}" for d in ("mig", "nvidia-smi") for p in (REAL / d).glob("*.txt")}
    assert files == all_items()
    for rel in files:
        meta = dict(ln.split(": ", 1) for ln in text(rel[:-4] + ".meta").splitlines())
        assert all(meta.get(k) for k in META_KEYS), rel
        assert meta["source"].startswith("https://"), rel
    assert len(files) >= 50


@pytest.mark.parametrize("rel", sorted(LGIP))
def test_lgip(rel):
    rows = mig.parse_lgip(text(rel))
    assert [(r.gpu, r.name, r.id, r.free, r.total, r.memory_gib) for r in rows] == LGIP[rel]


@pytest.mark.parametrize("rel", sorted(LGI))
def test_lgi(rel):
    assert [(g.gpu, g.profile, g.profile_id, g.id, g.placement) for g in mig.parse_lgi(text(rel))] == LGI[rel]


@pytest.mark.parametrize("rel", sorted(LCI))
def test_lci_with_and_without_the_placement_column(rel):
    assert [(c.gpu, c.gi, c.profile, c.profile_id, c.id) for c in mig.parse_lci(text(rel))] == LCI[rel]


@pytest.mark.parametrize("rel", sorted(NOT_PARSED))
def test_a_table_of_another_command_is_refused_not_misread(rel):
    for parse in (mig.parse_lgip, mig.parse_lgi, mig.parse_lci):
        with pytest.raises(mig.ParseError):
            parse(text(rel))


@pytest.mark.parametrize("rel", sorted(MIG_ERRORS))
def test_mig_errors_fail_the_mig_facts_with_nvidia_smis_words(rel):
    with pytest.raises(mig.ParseError):
        mig.parse_lci(text(rel))
    section = f"@@mig mode 0\n0, GPU-0, Enabled, Enabled\n@@mig lci 4\n{text(rel)}"
    f = mig.parse_section(section)
    assert f.state == "failed" and MIG_ERRORS[rel] in f.error and "exit status 4" in f.error


@pytest.mark.parametrize("rel", sorted(LIST))
def test_list(rel):
    assert {k: list(v) for k, v in mig.parse_list(text(rel)).items()} == LIST[rel]


def test_list_of_eight_rtx_pro_gpus_in_four_slices_each():
    devs = mig.parse_list(text(RTX_32))
    assert sorted(devs) == list(range(8)) and all([p for p, _ in d] == ["1g.24gb"] * 4 for d in devs.values())
    assert devs[0][0][1] == "MIG-445da789-865d-5fd1-b2b6-32a48bf66c39"
    assert devs[7][3][1] == "MIG-0f8a469f-1116-5095-9e94-65e7809b554d"


def _gpu(rc: int = 0) -> Section:
    return Section("0, NVIDIA H200, GPU-0, 590.48.01, 143771, Enabled", rc)


@pytest.mark.parametrize("rel", sorted(VERSION))
def test_cuda_version_from_nvidia_smi_version(rel):
    g = parse_nvidia_smi(_gpu(), Section(text(rel).rstrip("\n"), 0))
    assert g.state == "ok" and g.cuda_version == VERSION[rel]


@pytest.mark.parametrize("rel", sorted(COMPUTE_CAP))
def test_compute_caps(rel):
    assert parse_compute_caps(Section(text(rel).rstrip("\n"), 0)) == COMPUTE_CAP[rel]


@pytest.mark.parametrize("rel", sorted(SMI_ERRORS))
def test_the_first_nvidia_smi_call_failing(rel):
    rc, words = SMI_ERRORS[rel]
    g = parse_nvidia_smi(Section(text(rel).rstrip("\n"), rc))
    assert g.state == "failed" and g.error.startswith(words) and f"(exit status {rc})" in g.error
    assert not g.gpus


def test_no_devices_found_with_status_zero_is_still_a_failure():
    g = parse_nvidia_smi(Section(text("nvidia-smi/t4-530-no-devices-found.txt").rstrip("\n"), 0))
    assert g.state == "failed" and g.error == "No devices were found"


def test_the_projects_own_h200_capture():
    """tests/fixtures/h200 is real too (an H200, driver 580.159.04, MIG disabled), captured by gpuk8s itself: the
    only real sample of the probe's exact --query-gpu line; not copied here."""
    f = parse_probe((FIX / "h200" / "probe.txt").read_text())
    g = f.gpu
    assert (g.state, g.driver) == ("ok", "580.159.04")
    assert [(x.index, x.name, x.uuid, x.memory_mib, x.mig_mode) for x in g.gpus] == [
        (0, "NVIDIA H200", "GPU-e2e39985-6179-b0d9-893a-99df6a5c3a75", 143771, "Disabled")]
    version = (FIX / "h200" / "extra.txt").read_text().split("===\n")[-1].split("rc=")[0]
    assert parse_nvidia_smi(_gpu(), Section(version.rstrip("\n"), 0)).cuda_version == "13.0"


# ---- the defect: a host whose GPUs already hold MIG compute instances (real seven-column -lci)
def _probe_mig(lgip: str, lgi: str, lci: str, name: str, mem: int) -> str:
    """The probe's output around real MIG tables; the nvidia-smi and mode lines are written here (no public
    sample of those exact queries exists), the tables are the corpus's bytes."""
    smi = f"0, {name}, GPU-0, 610.43.02, {mem}, Enabled\n"
    sub = (f"@@mig mode 0\n0, GPU-0, Enabled, Enabled\n@@mig lgip 0\n{lgip}@@mig lgi 0\n{lgi}@@mig lci 0\n{lci}"
           "@@mig apps 0\n\n")
    return (f"@@gpuk8s-begin nvidia-smi\n{smi}\n@@gpuk8s-end nvidia-smi 0\n"
            f"@@gpuk8s-begin mig\n{sub}\n@@gpuk8s-end mig 0\n")


def test_a_host_with_compute_instances_passes_gpu_mig_capable():
    """Before: parse_lci refused the seven-column table, the MIG facts failed and gpu.mig-capable failed as
    blocking on every host that already had compute instances (the second install on)."""
    facts = parse_probe(_probe_mig(text("mig/rtxpro6000-lgip.txt"), text("mig/rtxpro6000-lgi-4x1g24gb.txt"),
                                   text("mig/rtxpro6000-lci-4x1g24gb-placement.txt"),
                                   "NVIDIA RTX PRO 6000 Blackwell Server Edition", 97887))
    assert facts.mig.state == "ok", facts.mig.error
    g = facts.mig.gpus[0]
    assert len(g.profiles) == 11 and len(g.instances) == 4 and len(g.computes) == 4
    inv = ("cluster: {name: lab}\nssh: {user: gpuk8s}\nhosts:\n"
           "  - {name: cp-1, address: 10.0.0.1, role: control-plane}\n"
           "  - {name: gpu-1, address: 10.0.0.2, gpus: 1, mig: {strategy: single, config: all-1g.24gb}}\n")
    r = {c.id: c for c in mig_checks(loader.loads(inv, "inv.yaml").host("gpu-1"), facts)}
    assert r["gpu.mig-capable"].status == "pass" and r["gpu.mig-profile"].status == "pass"
    assert "4 x 1g.24gb" in r["gpu.mig-profile"].message
    # the four 1g.24gb the real tables show are what the layout wants: nothing to change
    want = L.wanted(L.named("all-1g.24gb"), 0, model_for("NVIDIA RTX PRO 6000 Blackwell Server Edition", 97887))
    assert L.diff(L.state_of(g), want, MODELS["RTX-PRO-6000-96GB"]).status == "unchanged"


# ---- the profile tables against the real -lgip of their model
TABLE_OF = {
    "mig/a100-40gb-lgip-mig-user-guide.txt": "A100-40GB",
    "mig/a30-lgip-4x1g6gb-used.txt": "A30-24GB",
    "mig/h100-pcie-525-lgip.txt": "H100-PCIE-80GB",
    "mig/rtxpro6000-lgip.txt": "RTX-PRO-6000-96GB",
}


@pytest.mark.parametrize("rel", sorted(TABLE_OF))
def test_profile_tables_match_the_real_lgip(rel):
    model = MODELS[TABLE_OF[rel]]
    real = [(r.name, r.id, r.total, r.memory_gib) for r in mig.parse_lgip(text(rel))]
    assert [(p.name, p.id, p.instances, p.memory_gib) for p in model.profiles] == real
    assert rel.split("/")[1] in SOURCES[model.key]


def test_sm_counts_of_the_tables_are_the_real_ones():
    """-lgip's SM column (the first number after P2P), read by hand: A100-40GB 14 14 14 28 42 56 98; H100 PCIe 14
    14 14 30 46 62 114; RTX PRO 6000 46 (x5) 94 (x4) 188 (x2)."""
    assert [p.sm for p in MODELS["A100-40GB"].profiles] == [14, 14, 14, 28, 42, 56, 98]
    assert [p.sm for p in MODELS["H100-PCIE-80GB"].profiles] == [14, 14, 14, 30, 46, 62, 114]
    assert [p.sm for p in MODELS["RTX-PRO-6000-96GB"].profiles] == [46] * 5 + [94] * 4 + [188] * 2


def test_placements_of_the_real_lgi_are_ones_the_tables_allow():
    for rel, key in (("mig/a100-40gb-lgi-2-1-1-1-1-1-mig-user-guide.txt", "A100-40GB"),
                     ("mig/a100-40gb-lgi-3-2-1-1-mig-user-guide.txt", "A100-40GB"),
                     ("mig/a100-40gb-lgi-4-2-1-mig-user-guide.txt", "A100-40GB"),
                     ("mig/a30-lgi-4x1g6gb.txt", "A30-24GB"),
                     ("mig/h100-pcie-525-lgi-3g-1g-1g-1g.txt", "H100-PCIE-80GB"),
                     ("mig/rtxpro6000-lgi-2g-1g-1g.txt", "RTX-PRO-6000-96GB"),
                     ("mig/rtxpro6000-lgi-4x1g24gb.txt", "RTX-PRO-6000-96GB")):
        model = MODELS[key]
        for g in mig.parse_lgi(text(rel)):
            p = model.profile(g.profile)
            start, size = (int(x) for x in g.placement.split(":"))
            assert p is not None and p.id == g.profile_id and start in p.placements and size == p.size, (rel, g)
