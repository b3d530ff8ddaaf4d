"""GPU health (issue 32): the facts read from real texts (tests/fixtures/real/health/, each with its source), NVIDIA's
Xid catalogue, and the quick level's findings (gpuk8s/health/checks.py) on those facts. Readings written by hand
from the texts."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import pytest

from gpuk8s.driver.xid import CATALOGUE, lookup
from gpuk8s.facts.health import (
    HealthFacts,
    bus_key,
    health_facts,
    parse_kernel_log,
    parse_nvlink_status,
    parse_smi_query,
)
from gpuk8s.facts.model import GPUInfo
from gpuk8s.findings import FINDINGS
from gpuk8s.health.checks import QUICK, judge
from gpuk8s.inventory.model import Host, SSHSettings
from tests.unit.test_checks import facts

REAL = Path(__file__).resolve().parents[1] / "fixtures" / "real" / "health"


def real(name: str) -> str:
    head, sep, body = (REAL / name).read_text().partition("\n---\n")
    assert sep and "source: " in head and "verbatim: yes" in head and "form: " in head, f"{name}: no header"
    return body


# (file, GPUs, and per GPU shown: bus, name, ECC mode, uncorrected volatile, remap pending, remap failed,
#  width max/current, slowdowns, fabric state)
SMI_Q = {
    "smi-q-a10-535-remap-pending-gpud.txt": (1, {0: ("0000:07:00", "NVIDIA A10", "Enabled", 0, True, False, 16, 16,
                                                     (), "N/A")}),
    "smi-q-h100x8-535-hw-slowdown-gpud.txt": (8, {0: ("0000:19:00", "NVIDIA H100 80GB HBM3", "Enabled", 0, False,
                                                      False, 16, 16, ("HW Slowdown", "HW Power Brake Slowdown"),
                                                      "Completed")}),
    "smi-q-titanv-560-no-ecc-gpud.txt": (1, {0: ("0000:01:00", "NVIDIA TITAN V", "N/A", None, None, None, 16, 16, (),
                                                 "N/A")}),
    "smi-q-rtx4090x8-535-gpud.txt": (8, {0: ("0000:01:00", "NVIDIA GeForce RTX 4090", "Disabled", None, False, False,
                                             16, 16, (), "N/A")}),
}
# (file, [(bus, xid, instance)], fallen off the bus)
KERNEL = {
    "kernel-xid-48-63-94-dmesg-iso-gpud.txt": (
        [("0000:19:00", 48), ("0000:19:00", 63)] + [("0000:19:00", 94)] * 9, ()),
    "kernel-xid-79-no-pid-journalctl-pop-3363.txt": ([("0000:01:00", 79)], ("0000:01:00",)),
    "kernel-xid-79-pid-journalctl-ogkm-1010.txt": ([("0000:01:00", 79)], ("0000:01:00",)),
    "kernel-fallen-off-bus-570-multiline-nvsentinel-155.txt": ([], ("0000:b3:00",)),
    "kernel-xid-120-154-reset-required-dmesg-T-sirzzang.txt": ([("0000:2a:00", 120), ("0000:2a:00", 154)], ()),
}
NVLINK = {
    "nvlink-s-a100x8-all-up-gpud.txt": (8, 12, ()),
    "nvlink-s-v100-two-inactive-azhpc-73.txt": (1, 6, (3, 5)),
    "nvlink-s-b200-all-inactive-gpud-1085.txt": (1, 0, ()),
}


def test_every_real_health_text_is_in_a_table() -> None:
    names = {p.name for p in REAL.glob("*.txt")}
    dcgm = {n for n in names if n.startswith("dcgm-diag-")}  # tests/unit/test_dcgm.py reads each
    assert len(dcgm) == 3
    assert names == set(SMI_Q) | set(KERNEL) | set(NVLINK) | {"kernel-xid-119-gsp-dmesg-T-gpud.txt"} | dcgm


@pytest.mark.parametrize("name", sorted(SMI_Q))
def test_smi_query_real(name: str) -> None:
    gpus = parse_smi_query(real(name))
    count, shown = SMI_Q[name]
    assert len(gpus) == count
    for i, (bus, model, ecc, unc, pend, fail, wmax, wcur, slow, fabric) in shown.items():
        g = gpus[i]
        assert (g.bus, g.name, g.ecc_mode, g.uncorrected_volatile, g.remap_pending, g.remap_failed) == (
            bus, model, ecc, unc, pend, fail)
        assert (g.width_max, g.width_current, g.slowdowns, g.fabric_state) == (wmax, wcur, slow, fabric)


def test_smi_query_reads_the_a10s_remap_and_the_h100s_eight_gpus() -> None:
    a10 = parse_smi_query(real("smi-q-a10-535-remap-pending-gpud.txt"))[0]
    assert a10.remap_uncorrectable == 4 and a10.persistence == "Enabled" and a10.retired_pending is None
    h100 = parse_smi_query(real("smi-q-h100x8-535-hw-slowdown-gpud.txt"))
    assert len({g.bus for g in h100}) == 8 and all(g.fabric_status == "Success" for g in h100)
    assert parse_smi_query("Failed to initialize NVML: Driver/library version mismatch\n") == ()


@pytest.mark.parametrize("name", sorted(KERNEL))
def test_kernel_log_real(name: str) -> None:
    k = parse_kernel_log(real(name))
    want, fallen = KERNEL[name]
    assert [(e.bus, e.xid) for e in k.xids] == want
    assert k.fallen == fallen


def test_kernel_log_leaves_out_pid_and_name_and_keeps_the_text() -> None:
    k = parse_kernel_log(real("kernel-xid-48-63-94-dmesg-iso-gpud.txt"))
    assert k.xids[0].text.startswith("An uncorrectable double bit error (DBE) has been detected on GPU")
    assert k.xids[3].text == "Ch 00000008"  # pid=1248209, name=python3.10 left out
    assert k.xids[0].line.startswith("NVRM: Xid (PCI:0000:19:00): 48, ")
    g = parse_kernel_log(real("kernel-xid-119-gsp-dmesg-T-gpud.txt"))
    assert {e.xid for e in g.xids} == {119} and g.xids[0].text.startswith("Timeout after 6s of waiting for RPC")


def test_kernel_log_mig_attribution_from_nvidias_format() -> None:
    # the format NVIDIA's source documents for a contained error in a MIG partition (kern_gpu_error_cont_ga100.c)
    k = parse_kernel_log("NVRM: Xid (PCI:0000:01:00 GPU-I:05): 94, pid=7194, Contained: CE User Channel (0x9). "
                         "RST: No, D-RST: No\n")
    assert [(e.bus, e.xid, e.instance) for e in k.xids] == [("0000:01:00", 94, "GPU-I:05")]


@pytest.mark.parametrize("name", sorted(NVLINK))
def test_nvlink_status_real(name: str) -> None:
    gpus = parse_nvlink_status(real(name))
    count, links, inactive = NVLINK[name]
    assert len(gpus) == count and all(g.links == links for g in gpus)
    assert gpus[0].inactive == inactive
    assert parse_nvlink_status("") == ()  # an A10: nvidia-smi nvlink -s prints nothing


def test_bus_keys_of_nvidia_smi_and_the_kernel_agree() -> None:
    assert bus_key("00000000:07:00.0") == bus_key("PCI:0000:07:00") == bus_key("0000:07:00.0") == "0000:07:00"
    assert bus_key("GPU-abc") is None and bus_key("0000:7:00") is None


def test_hostile_text_is_bounded_and_linear() -> None:
    t0 = time.process_time()
    flood = ("NVRM: Xid (PCI:0000:01:00): 13, " + "A" * 5000 + "\n") * 2000
    k = parse_kernel_log(flood + "x" * 1_000_000)
    assert len(k.xids) == 256 and k.more == 2000 - 256 and all(len(e.text) <= 200 for e in k.xids)
    parse_smi_query(("GPU 00000000:01:00.0\n" + "    " * 500 + ": " * 5000 + "\n") * 200)
    parse_nvlink_status(("GPU 0: " + "x" * 100000 + "\n") * 50)
    assert time.process_time() - t0 < 5


# -- NVIDIA's Xid catalogue -----------------------------------------------------------------------------------------

def test_the_catalogue_judges_as_nvidias_immediate_action_says() -> None:
    fatal = {n for n, x in CATALOGUE.items() if x.fatal}
    assert fatal == {48, 64, 74, 79, 95, 119, 120}
    assert all(CATALOGUE[n].action in ("RESET_GPU", "RESTART_BM") or n in (48, 74) for n in fatal)
    assert not lookup(9999).fatal and "not in gpuk8s's Xid catalogue" in lookup(9999).meaning


# -- the quick level's findings -----------------------------------------------------------------------------------

HOST8 = Host("gpu-1", "10.0.0.11", "worker", SSHSettings(), gpus=8)
HOST1 = replace(HOST8, gpus=1)


def statuses(host: Host, h: HealthFacts, **kw: object) -> dict[str, str]:
    got = judge(host, facts(**kw), h)
    assert [f.id for f in got] == list(QUICK) or [f.id for f in got][:1] == ["health.gpu-count"]
    return {f.id: f.status for f in got}


def h100(kernel: str = "", nvlink: str = "") -> HealthFacts:
    return health_facts((0, real("smi-q-h100x8-535-hw-slowdown-gpud.txt")), (0, nvlink), (0, kernel))


def test_every_quick_id_is_registered_for_health() -> None:
    assert all("health" in FINDINGS[i].sources for i in QUICK)


def test_a_healthy_h100_server_passes_but_its_power_brake_is_named() -> None:
    got = statuses(HOST8, h100(nvlink=real("nvlink-s-a100x8-all-up-gpud.txt")))
    assert got == {"health.gpu-count": "pass", "health.xid": "pass", "health.xid-app": "pass",
                   "health.ecc-uncorrected": "pass", "health.retired-pages-pending": "skip",
                   "health.row-remap-pending": "pass", "health.row-remap-failed": "pass", "health.pcie-width": "pass",
                   "health.nvlink-down": "pass", "health.clocks-slowdown": "warn", "health.fabric": "pass"}


def test_the_a10_with_a_pending_remap_fails_and_says_reset() -> None:
    h = health_facts((0, real("smi-q-a10-535-remap-pending-gpud.txt")), (0, ""), (0, ""))
    got = judge(HOST1, facts(gpu=GPUInfo("ok", "535.129.03", (535, 129, 3), "12.2", facts().gpu.gpus[:1])), h)
    by = {f.id: f for f in got}
    pend = by["health.row-remap-pending"]
    assert pend.status == "fail" and "GPU 0 (0000:07:00)" in pend.message
    assert "reset the GPU" in by["health.row-remap-pending"].remedy
    assert by["health.nvlink-down"].status == "skip"


def test_xid_79_and_a_gpu_off_the_bus_fail_with_the_kernels_lines() -> None:
    h = h100(kernel=real("kernel-xid-79-no-pid-journalctl-pop-3363.txt"))
    by = {f.id: f for f in judge(HOST8, facts(), h)}
    assert by["health.xid"].status == "fail" and "Xid 79 (GPU has fallen off the bus)" in by["health.xid"].message
    assert by["health.xid"].evidence == ("NVRM: Xid (PCI:0000:01:00): 79, GPU has fallen off the bus.",)
    assert "reboot" in by["health.xid"].remedy
    multi = h100(kernel=real("kernel-fallen-off-bus-570-multiline-nvsentinel-155.txt"))
    by = {f.id: f for f in judge(HOST8, facts(), multi)}
    assert by["health.xid"].status == "fail" and "0000:b3:00 fell off the bus (no Xid line)" in by["health.xid"].message


def test_application_xids_warn_and_the_dbe_fails() -> None:
    h = h100(kernel=real("kernel-xid-48-63-94-dmesg-iso-gpud.txt"))
    by = {f.id: f for f in judge(HOST8, facts(), h)}
    assert by["health.xid"].status == "fail" and "Xid 48 (Double Bit ECC Error) on GPU 0 (0000:19:00)" in \
        by["health.xid"].message
    app = by["health.xid-app"]
    assert app.status == "warn" and "Xid 94 (Contained memory error) x9" in app.message
    gsp = h100(kernel=real("kernel-xid-119-gsp-dmesg-T-gpud.txt"))
    assert {f.id: f.status for f in judge(HOST8, facts(), gsp)}["health.xid"] == "fail"


def test_a_missing_gpu_fails_the_count_against_the_inventory_and_lspci() -> None:
    seven = facts(gpu=replace(facts().gpu, gpus=facts().gpu.gpus[:7]))
    by = {f.id: f for f in judge(HOST8, seven, h100())}
    assert by["health.gpu-count"].status == "fail" and "expects 8 GPU(s): nvidia-smi lists 7 GPU(s), lspci 8" in \
        by["health.gpu-count"].message
    no_count = replace(HOST8, gpus=None)
    by = {f.id: f for f in judge(no_count, seven, h100())}
    assert by["health.gpu-count"].status == "fail" and "1 GPU(s) on the PCI bus" in by["health.gpu-count"].message


def test_inactive_links_narrow_pcie_and_uncorrected_ecc() -> None:
    text = real("smi-q-h100x8-535-hw-slowdown-gpud.txt")
    line = "                Current                   : 16x"
    worse = text.replace(line, line.replace("16x", "8x"), 1)
    assert worse != text
    h = health_facts((0, worse), (0, real("nvlink-s-v100-two-inactive-azhpc-73.txt")), (0, ""))
    by = {f.id: f for f in judge(HOST8, facts(), h)}
    width = by["health.pcie-width"]
    assert width.status == "warn" and "GPU 0 (0000:19:00) x8 of x16" in width.message
    assert by["health.nvlink-down"].status == "fail" and "GPU 3 link(s) 3, 5" in by["health.nvlink-down"].message


def test_without_a_driver_or_a_kernel_log_checks_are_skipped_with_the_reason() -> None:
    none = facts(gpu=GPUInfo("absent", None, None, None, ()))
    got = {f.id: f for f in judge(HOST8, none, health_facts(None, None, (127, "neither journalctl nor dmesg")))}
    assert got["health.gpu-count"].status == "fail" and got["health.xid"].status == "skip"
    assert "neither journalctl nor dmesg" in got["health.xid"].message
    assert got["health.row-remap-pending"].status == "skip"
    failed_smi = health_facts((15, "Unable to determine the device handle for GPU0000:91:00.0: Unknown Error"),
                              (0, ""), (0, ""))
    got = {f.id: f for f in judge(HOST8, facts(), failed_smi)}
    assert got["health.ecc-uncorrected"].status == "skip" and "Unknown Error" in got["health.ecc-uncorrected"].message


# -- the host side: the kernel log section's shell, run here with fake journalctl and dmesg -------------------------

def _klog(tmp_path: Path, journal: str | None, dmesg: str | None, dmesg_rc: int = 0,
          journal_rc: int = 0) -> tuple[int, str]:
    import re
    import shutil
    import subprocess

    from gpuk8s.health.run import EXTRA

    func = re.search(r"^klog\(\) \{.*?^\}$.*?^klog_cut\(\) \{.*?^\}$", EXTRA, re.S | re.M)
    assert func is not None
    bin_ = tmp_path / "bin"
    bin_.mkdir(exist_ok=True)
    for tool in ("sh", "grep", "head", "printf", "cat", "awk"):
        p = shutil.which(tool)
        if p:
            (bin_ / tool).unlink(missing_ok=True)
            (bin_ / tool).symlink_to(p)
    for name, text, rc in (("journalctl", journal, journal_rc), ("dmesg", dmesg, dmesg_rc)):
        (bin_ / name).unlink(missing_ok=True)
        if text is not None:
            (tmp_path / f"{name}.txt").write_text(text)
            (bin_ / name).write_text(f"#!/bin/sh\ncat {tmp_path}/{name}.txt\nexit {rc}\n")
            (bin_ / name).chmod(0o755)
    p = subprocess.run(["/bin/sh", "-c", func.group(0) + "\nklog"], capture_output=True, text=True,
                       env={"PATH": str(bin_)})
    return p.returncode, p.stdout


def test_the_kernel_section_reads_the_journal_else_dmesg_and_names_dmesgs_failure(tmp_path: Path) -> None:
    xid = real("kernel-xid-79-no-pid-journalctl-pop-3363.txt")
    rc, out = _klog(tmp_path, xid, "[1.0] NVRM: Xid (PCI:0000:02:00): 48, from dmesg\n")
    assert rc == 0 and [e.xid for e in parse_kernel_log(out).xids] == [79]  # the journal, when it has the kernel's
    assert "nvidia-modeset" not in out  # only the NVRM lines that name an Xid or a GPU off the bus
    rc, out = _klog(tmp_path, "", real("kernel-xid-48-63-94-dmesg-iso-gpud.txt"))
    assert rc == 0 and [e.xid for e in parse_kernel_log(out).xids][:2] == [48, 63]
    rc, out = _klog(tmp_path, None, "dmesg: read kernel buffer failed: Operation not permitted\n", dmesg_rc=1)
    assert rc == 1 and "Operation not permitted" in out
    assert health_facts(None, None, (rc, out)).kernel_read is False
    rc, out = _klog(tmp_path, None, None)
    assert rc == 127 and "neither journalctl nor dmesg" in out


def test_a_journal_cut_by_the_timeout_gives_way_to_the_ring_buffer(tmp_path: Path) -> None:
    """journalctl reads from the boot on: cut by `timeout` (124) it lost the newest lines, where a recent Xid is."""
    old = "Apr 29 19:24:11 h kernel: NVRM: Xid (PCI:0000:19:00): 13, Graphics Exception\n"
    rc, out = _klog(tmp_path, old, real("kernel-xid-48-63-94-dmesg-iso-gpud.txt"), journal_rc=124)
    assert rc == 0 and [e.xid for e in parse_kernel_log(out).xids][:2] == [48, 63] and "@@journalctl" not in out
    rc, out = _klog(tmp_path, old, "", journal_rc=0)
    assert rc == 0 and [e.xid for e in parse_kernel_log(out).xids] == [13] and "@@journalctl" not in out


# -- what an independent review of the first version found ---------------------------------------------------------

def test_a_storm_of_application_xids_does_not_hide_a_later_fatal_one() -> None:
    storm = "".join(f"NVRM: Xid (PCI:0000:19:00): 13, Graphics Exception {i}\n" for i in range(300))
    tail = real("kernel-xid-79-no-pid-journalctl-pop-3363.txt") + \
        "NVRM: Xid (PCI:0000:19:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable double bit error\n"
    k = parse_kernel_log(storm + tail)
    assert len(k.xids) == 256 and k.more == 46 and k.fallen == ("0000:01:00",)
    assert {(e.xid, e.bus, c) for e, c in k.firsts} == {(13, "0000:19:00", 300), (79, "0000:01:00", 1),
                                                        (48, "0000:19:00", 1)}
    by = {f.id: f for f in judge(HOST8, facts(), h100(kernel=storm + tail))}
    assert by["health.xid"].status == "fail" and "Xid 48" in by["health.xid"].message and \
        "Xid 79" in by["health.xid"].message
    assert "Xid 13 (Graphics Engine Exception) x300" in by["health.xid-app"].message


def test_an_xid_154_naming_a_reset_fails_and_a_gpu_that_reports_reset_required_fails() -> None:
    by = {f.id: f for f in judge(HOST8, facts(), h100(kernel=real(
        "kernel-xid-120-154-reset-required-dmesg-T-sirzzang.txt")))}
    assert by["health.xid"].status == "fail"
    assert "Xid 154 (GPU Recovery Action Changed: GPU Reset Required)" in by["health.xid"].message
    assert "Xid 120 (GSP Error)" in by["health.xid"].message
    calm = "NVRM: Xid (PCI:0000:19:00): 154, GPU recovery action changed from 0x1 (GPU Reset Required) to 0x0 (None)\n"
    by = {f.id: f for f in judge(HOST8, facts(), h100(kernel=calm + real(
        "kernel-xid-120-154-reset-required-dmesg-T-sirzzang.txt")))}
    assert "Xid 154 (GPU Recovery Action Changed: GPU Reset Required)" in by["health.xid"].message  # not the None one
    assert "Xid 154 (GPU Recovery Action Changed) x1" in by["health.xid-app"].message
    text = real("smi-q-h100x8-535-hw-slowdown-gpud.txt")
    line = "        Reset Required                    : No"
    assert line in text
    owed = health_facts((0, text.replace(line, line.replace("No", "Yes"), 1)), (0, ""), (0, ""))
    by = {f.id: f for f in judge(HOST8, facts(), owed)}
    assert by["health.xid"].status == "fail" and "GPU 0 (0000:19:00) reports GPU Reset Required" in \
        by["health.xid"].message


def test_nvlink_all_links_down_fails_where_nvlink_is_used_and_pcie_gpus_skip() -> None:
    up = real("nvlink-s-a100x8-all-up-gpud.txt")
    dark = real("nvlink-s-b200-all-inactive-gpud-1085.txt")
    by = {f.id: f for f in judge(HOST8, facts(), h100(nvlink=up.rstrip("\n") + "\n" + dark))}
    assert by["health.nvlink-down"].status == "fail" and "GPU 2 every link" in by["health.nvlink-down"].message
    alone = {f.id: f for f in judge(HOST8, facts(), h100(nvlink=dark))}["health.nvlink-down"]
    assert alone.status == "skip"  # PCIe GPUs without a bridge say the same for every GPU
    assert {f.id: f for f in judge(HOST8, facts(), h100(nvlink=""))}["health.nvlink-down"].status == "skip"


def test_a_cpu_host_named_is_skipped_not_failed() -> None:
    from gpuk8s.facts.model import GPUInfo as G

    cpu = replace(HOST8, gpus=0)
    got = judge(cpu, facts(gpu=G("absent", None, None, None, ())), HealthFacts())
    assert {f.status for f in got} == {"skip"} and len(got) == len(QUICK)


def test_a_long_smi_line_without_a_colon_is_linear() -> None:
    t0 = time.process_time()
    parse_smi_query("GPU 00000000:01:00.0\n" + ("    a" + " " * 4000 + "b\n") * 2000)
    assert time.process_time() - t0 < 2
