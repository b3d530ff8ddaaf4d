"""MIG preflight findings (gpuk8s/preflight/mig_checks.py) and the mig phase's plan per host
(gpuk8s/phases/mig.py): pure, on facts parsed from probe text as a host would send it."""

from __future__ import annotations

import subprocess
from pathlib import Path

from gpuk8s.facts.parse import parse_probe
from gpuk8s.inventory import loader
from gpuk8s.inventory.model import Host
from gpuk8s.phases.mig import host_plan, parse_result
from gpuk8s.preflight.host_checks import check_host
from gpuk8s.preflight.mig_checks import mig_checks

MIGFIX = Path(__file__).resolve().parent.parent / "fixtures" / "mig"
A100 = ("NVIDIA A100-SXM4-80GB", 81920)
H200 = ("NVIDIA H200", 143771)
L4 = ("NVIDIA L4", 23034)


def facts(model=A100, n=2, driver="535.104.05", modes=None, lgi="", lci="", apps=""):
    name, mem = model
    smi = "".join(f"{i}, {name}, GPU-{i}, {driver}, {mem}, Disabled\n" for i in range(n))
    modes = modes or ["Disabled, Disabled"] * n
    mode = "".join(f"{i}, GPU-{i}, {m}\n" for i, m in enumerate(modes))
    sub = f"@@mig mode 0\n{mode}@@mig lgi 0\n{lgi}\n@@mig lci 0\n{lci}\n@@mig apps 0\n{apps}\n"
    return parse_probe(f"@@gpuk8s-begin nvidia-smi\n{smi}\n@@gpuk8s-end nvidia-smi 0\n"
                       f"@@gpuk8s-begin mig\n{sub}\n@@gpuk8s-end mig 0\n")


def host(mig: str, gpus=2, sharing="") -> Host:
    text = ("cluster: {name: lab}\nssh: {user: gpuk8s}\nhosts:\n"
            "  - {name: cp-1, address: 10.0.0.1, role: control-plane}\n"
            f"  - {{name: gpu-1, address: 10.0.0.2, gpus: {gpus}, mig: {mig}{sharing}}}\n")
    return loader.loads(text, "inv.yaml").host("gpu-1")


def by_id(results):
    return {r.id: r for r in results}


def test_a_good_a100_passes_every_mig_check():
    r = by_id(mig_checks(host("{strategy: single, config: all-1g.10gb}"), facts()))
    assert {k: v.status for k, v in r.items()} == {
        "gpu.mig-capable": "pass", "gpu.mig-profile": "pass", "gpu.mig-driver": "pass", "gpu.mig-pending": "pass",
        "gpu.mig-processes": "pass"}
    assert "GPU 0: 7 x 1g.10gb" in r["gpu.mig-profile"].message


def test_no_mig_key_no_checks_and_check_host_includes_them():
    assert mig_checks(host("{strategy: none}"), facts()) == []
    from gpuk8s.inventory.model import Cluster
    ids = [c.id for c in check_host(host("{strategy: mixed, config: all-3g.40gb}"), facts(), Cluster())]
    assert "gpu.mig-profile" in ids and "gpu.mig-driver" in ids


def test_mig_on_an_l4_is_refused():
    r = by_id(mig_checks(host("{strategy: single, config: all-1g.10gb}"),
                         facts(L4, modes=["[N/A], [N/A]"] * 2)))
    assert r["gpu.mig-capable"].status == "fail"
    assert r["gpu.mig-capable"].message.startswith("MIG requested on a GPU without MIG (NVIDIA L4)")
    assert r["gpu.mig-profile"].status == "skip"


def test_a_profile_the_model_lacks_names_its_smallest():
    r = by_id(mig_checks(host("{strategy: single, config: all-1g.10gb}"), facts(H200, driver="570.124.06")))
    p = r["gpu.mig-profile"]
    assert p.status == "fail" and p.severity == "error"
    assert "profile 1g.10gb does not exist on NVIDIA H200 (140 GiB) (its smallest is 1g.18gb)" in p.message
    assert "1g.18gb" in p.remedy
    r = by_id(mig_checks(host("{strategy: mixed, config: [{devices: all, mig-devices: {'4g.40gb': 2}}]}"), facts()))
    assert r["gpu.mig-profile"].status == "fail" and "do not fit" in r["gpu.mig-profile"].message


def test_driver_below_the_floor_of_the_architecture():
    r = by_id(mig_checks(host("{strategy: single, config: all-1g.10gb}"), facts(driver="450.51.06")))
    assert r["gpu.mig-driver"].status == "fail" and "below R450 (450.80.02)" in r["gpu.mig-driver"].message
    r = by_id(mig_checks(host("{strategy: single, config: all-1g.18gb}"), facts(H200, driver="535.104.05")))
    assert r["gpu.mig-driver"].status == "fail" and "R550" in r["gpu.mig-driver"].message
    r = by_id(mig_checks(host("{strategy: single, config: all-1g.18gb}"), facts(H200, driver="550.90.07")))
    assert r["gpu.mig-driver"].status == "pass"
    # the A30's floor is R460, above the A100's R450 (MIG user guide, "Deployment Considerations")
    r = by_id(mig_checks(host("{strategy: single, config: all-1g.6gb}"), facts(("NVIDIA A30", 24576),
                                                                            driver="450.80.02")))
    assert r["gpu.mig-driver"].status == "fail" and "R460 (460.73.01)" in r["gpu.mig-driver"].message


def test_pending_mode_and_processes():
    apps = "GPU-0, 11, python3\nGPU-0, 12, python3\nGPU-0, 13, /usr/bin/dcgm\n"
    r = by_id(mig_checks(host("{strategy: single, config: all-1g.10gb}"),
                         facts(modes=["Disabled, Enabled", "Disabled, Disabled"], apps=apps)))
    assert r["gpu.mig-pending"].status == "warn" and r["gpu.mig-pending"].severity == "warning"
    assert "MIG mode is pending on GPU 0" in r["gpu.mig-pending"].message
    assert "reset or a reboot" in r["gpu.mig-pending"].message
    pr = r["gpu.mig-processes"]
    assert pr.status == "warn" and pr.message.startswith("3 processes use GPU 0 (dcgm, python3)")
    assert pr.message.endswith("stop them before MIG can be changed")
    # processes on a GPU that is already right do not matter
    lgi = (MIGFIX / "a100-80gb-lgi.txt").read_text()
    lci = (MIGFIX / "a100-80gb-lci.txt").read_text()
    ok = facts(modes=["Enabled, Enabled", "Enabled, Enabled"], lgi=lgi, lci=lci, apps=apps)
    r = by_id(mig_checks(host("{strategy: mixed, config: [{devices: [0], mig-devices: {'3g.40gb': 1, "
                              "'4g.40gb': 1}}, {devices: [1], mig-enabled: false}]}"), ok))
    assert r["gpu.mig-processes"].status == "pass", r["gpu.mig-processes"].message


def test_the_host_plan_changes_only_what_differs_and_renders_valid_shell():
    lgi = (MIGFIX / "a100-80gb-lgi.txt").read_text()
    lci = (MIGFIX / "a100-80gb-lci.txt").read_text()
    f = facts(modes=["Enabled, Enabled", "Disabled, Disabled"], lgi=lgi, lci=lci)
    hm = host_plan(host("{strategy: mixed, config: [{devices: all, mig-devices: {'3g.40gb': 1, '4g.40gb': 1}}]}"), f)
    assert hm.error == "" and hm.unchanged == [0] and [c.index for c in hm.changes] == [1]
    assert hm.conf.splitlines()[1:] == ["0 on 4g.40gb,3g.40gb", "1 on 4g.40gb,3g.40gb"]
    script = hm.script()
    assert "gk_gpu 1 1 no 4g.40gb,3g.40gb" in script and "gk_gpu 0" not in script
    subprocess.run(["sh", "-n"], input=script, text=True, check=True)
    off = host_plan(host("{strategy: none}"), f)
    assert [c.index for c in off.changes] == [0] and off.changes[0].destroy and off.changes[0].mode == 0
    assert "gk_gpu 0 0 yes -" in off.script() and "if [ no = yes ]" in off.script()
    bad = host_plan(host("{strategy: single, config: all-1g.10gb}"), facts(L4, modes=["[N/A], [N/A]"] * 2))
    assert bad.error.startswith("GPU 0: MIG requested on a GPU without MIG (NVIDIA L4)")


def test_the_scripts_result_lines():
    out = ("@@gpuk8s-mig files changed\n@@gpuk8s-mig gpu 0 changed\n"
           "@@gpuk8s-mig gpu 1 needs-reboot GPU 00000000:11:00.0 is currently in use by another process.\n"
           "@@gpuk8s-mig gpu x changed\nnoise\n")
    assert parse_result(out) == (True, {0: ("changed", ""), 1: (
        "needs-reboot", "GPU 00000000:11:00.0 is currently in use by another process.")})


def test_a_profile_the_hosts_driver_does_not_list_fails_before_the_install():
    """The host's own -lgip is the truth: an A100-80GB on R515 lists no 1g.20gb (NVIDIA/mig-parted issue 97 and
    public R515 captures show 1g.10gb, 1g.10gb+me, 2g.20gb, 3g.40gb, 4g.40gb, 7g.80gb). The table here is the
    modelled fixture less its 1g.20gb rows."""
    rows = (MIGFIX / "a100-80gb-lgip.txt").read_text().splitlines()
    at = next(n for n, ln in enumerate(rows) if "MIG 1g.20gb" in ln)
    lgip = "\n".join(rows[:at] + rows[at + 3:]) + "\n"
    name, mem = A100
    smi = f"0, {name}, GPU-0, 515.86.01, {mem}, Enabled\n"
    sub = (f"@@mig mode 0\n0, GPU-0, Enabled, Enabled\n@@mig lgip 0\n{lgip}"
           "@@mig lgi 6\nNo GPU instances found: Not Found\n")
    f = parse_probe(f"@@gpuk8s-begin nvidia-smi\n{smi}\n@@gpuk8s-end nvidia-smi 0\n"
                    f"@@gpuk8s-begin mig\n{sub}@@mig apps 0\n\n@@gpuk8s-end mig 0\n")
    assert f.mig.state == "ok" and "1g.20gb" not in {p.name for p in f.mig.gpus[0].profiles}
    r = by_id(mig_checks(host("{strategy: single, config: all-1g.20gb}", gpus=1), f))
    p = r["gpu.mig-profile"]
    assert p.status == "fail" and "does not offer 1g.20gb" in p.message and "1g.10gb, 1g.10gb+me" in p.message
    assert "nvidia-smi mig -lgip" in p.remedy
    assert by_id(mig_checks(host("{strategy: single, config: all-1g.10gb}", gpus=1), f))[
        "gpu.mig-profile"].status == "pass"
