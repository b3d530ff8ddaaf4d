"""MIG on the lab: the mig phase (gpuk8s/phases/mig.py) run directly over SSH against faked A100 and H200
GPUs (tests/lab/fakes/fake.py models MIG from NVIDIA's MIG user guide): layouts applied, a second run that
changes nothing, a reboot that the boot unit survives, a held GPU that needs a reboot, and back to none."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from gpuk8s.facts import mig as migparse
from gpuk8s.inventory.loader import load
from gpuk8s.mig import layout as L
from gpuk8s.mig.profiles import model_for
from gpuk8s.phases.base import Context
from gpuk8s.phases.mig import Mig
from gpuk8s.phases.prepare import refresh_facts
from gpuk8s.remote import Session

FLEET = """hosts:
  - name: cp-1
    role: control-plane
  - name: gpu-1
    gpus: 2
  - name: gpu-2
    gpus: 2
    gpu_model: NVIDIA H200
    gpu_memory_mib: 143771
    driver: 570.124.06
"""
A100 = {"strategy": "single", "config": "all-1g.10gb"}
H200 = {"strategy": "mixed", "config": [{"devices": "all", "mig-devices": {"3g.71gb": 2}}]}
WRITES = ("-mig", "-r", "-cgi", "-dci", "-dgi")


def context(lab: Any, tmp: Path, mig: dict[str, dict[str, Any]]) -> Context:
    """The inventory of the lab with `mig` per host, sessions to the GPU hosts and their facts."""
    data = yaml.safe_load(lab.inventory.read_text())
    for h in data["hosts"]:
        if h["name"] in mig:
            h["mig"] = mig[h["name"]]
    path = tmp / f"inv-{len(list(tmp.glob('inv-*')))}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    inv = load(path)
    sessions = {h.name: Session(h) for h in inv.hosts if h.name != "cp-1"}
    return Context(inv=inv, sessions=sessions, facts=refresh_facts(sessions, 4))


def devices(lab: Any, host: str) -> dict[int, list[str]]:
    """The MIG devices nvidia-smi -L lists per GPU, run on the host as an operator would."""
    out = lab.host(host).exec("nvidia-smi -L").stdout
    return {i: [p for p, _ in devs] for i, devs in migparse.parse_list(out).items()}


def writes(lab: Any, host: str) -> int:
    return sum(1 for a in lab.host(host).commands() if a[0] == "nvidia-smi" and any(w in a for w in WRITES))


def test_layouts_applied_unchanged_rebooted_and_back_to_none(lab_up, tmp_path):
    lab = lab_up(FLEET)
    ctx = context(lab, tmp_path, {"gpu-1": A100, "gpu-2": H200})
    try:
        plan = Mig().plan(ctx)
        assert plan.status == "would-change"
        assert [c.host for c in plan.changes] == ["gpu-1", "gpu-2"]
        assert "gk_gpu 0 1 no 1g.10gb,1g.10gb,1g.10gb,1g.10gb,1g.10gb,1g.10gb,1g.10gb" in plan.changes[0].commands
        assert writes(lab, "gpu-1") == 0 and writes(lab, "gpu-2") == 0  # the plan changed nothing

        r = Mig().run(ctx)
        assert r.status == "changed", r.to_json()
        assert devices(lab, "gpu-1") == {0: ["1g.10gb"] * 7, 1: ["1g.10gb"] * 7}
        assert devices(lab, "gpu-2") == {0: ["3g.71gb"] * 2, 1: ["3g.71gb"] * 2}
        # what the device plugin will advertise, from the facts read after the change
        for name, want in (("gpu-1", {"nvidia.com/gpu": 14}), ("gpu-2", {"nvidia.com/mig-3g.71gb": 4})):
            f, s = ctx.facts[name], ctx.inv.host(name).gpu.mig
            gpus = [(g.index, model_for(g.name, g.memory_mib)) for g in f.gpu.gpus]
            got = L.mig_resources(s.layout, s.strategy, gpus)
            assert got == want
            listed = sum(len(v) for v in devices(lab, name).values())
            assert listed == sum(got.values())
            assert "gpuk8s-mig" in lab.host(name).state()["enabled"]
        assert lab.host("gpu-1").read("/etc/gpuk8s/mig.conf").splitlines()[1:] == [
            "0 on " + ",".join(["1g.10gb"] * 7), "1 on " + ",".join(["1g.10gb"] * 7)]

        # a second run changes nothing: no MIG command that writes
        before = writes(lab, "gpu-1") + writes(lab, "gpu-2")
        ctx2 = context(lab, tmp_path, {"gpu-1": A100, "gpu-2": H200})
        assert Mig().plan(ctx2).status == "unchanged"
        r = Mig().run(ctx2)
        assert r.status == "unchanged", r.to_json()
        assert writes(lab, "gpu-1") + writes(lab, "gpu-2") == before
        ctx2.close()

        # a reboot: the instances are gone, the boot unit re-creates them
        lab.host("gpu-1").reboot()
        assert devices(lab, "gpu-1") == {0: ["1g.10gb"] * 7, 1: ["1g.10gb"] * 7}
        # without the unit (disabled by hand) a reboot leaves whole GPUs in MIG mode, and a re-run re-creates them
        lab.host("gpu-2").update_state(enabled=[u for u in lab.host("gpu-2").state()["enabled"] if u != "gpuk8s-mig"])
        lab.host("gpu-2").reboot()
        assert devices(lab, "gpu-2") == {0: [], 1: []}
        ctx3 = context(lab, tmp_path, {"gpu-1": A100, "gpu-2": H200})
        r = Mig().run(ctx3)
        assert r.status == "changed" and r.hosts["gpu-1"].startswith("unchanged"), r.to_json()
        assert devices(lab, "gpu-2") == {0: ["3g.71gb"] * 2, 1: ["3g.71gb"] * 2}
        assert "gpuk8s-mig" in lab.host("gpu-2").state()["enabled"]
        ctx3.close()

        # back to none: instances destroyed, MIG off, whole GPUs, the unit gone
        ctx4 = context(lab, tmp_path, {"gpu-1": {"strategy": "none"}, "gpu-2": {"strategy": "none"}})
        r = Mig().run(ctx4)
        assert r.status == "changed", r.to_json()
        for name in ("gpu-1", "gpu-2"):
            assert devices(lab, name) == {0: [], 1: []}
            modes = lab.host(name).exec("nvidia-smi --query-gpu=mig.mode.current,mig.mode.pending "
                                        "--format=csv,noheader").stdout.split()
            assert modes == ["Disabled,", "Disabled"] * 2
            assert lab.host(name).read("/etc/systemd/system/gpuk8s-mig.service") is None
        assert Mig().run(context(lab, tmp_path, {"gpu-1": {"strategy": "none"}})).status == "unchanged"
        ctx4.close()
    finally:
        ctx.close()


def test_a_held_gpu_needs_a_reboot_and_the_others_complete(lab_up, tmp_path):
    lab = lab_up(FLEET)
    lab.host("gpu-1").hold_gpu(1, 4242, "python3")
    ctx = context(lab, tmp_path, {"gpu-1": A100, "gpu-2": H200})
    try:
        assert [p.pid for p in ctx.facts["gpu-1"].mig.gpus[1].processes] == [4242]
        r = Mig().run(ctx)
        assert r.status == "failed" and "needs a reboot: gpu-1" in r.message, r.to_json()
        assert r.hosts["gpu-1"].startswith("needs-reboot") and "sudo systemctl reboot" in r.hosts["gpu-1"]
        assert "currently in use by another process" in r.hosts["gpu-1"]
        assert r.hosts["gpu-2"].startswith("changed")
        assert devices(lab, "gpu-1") == {0: ["1g.10gb"] * 7, 1: []}
        g1 = lab.host("gpu-1").mig_state()["1"]
        assert (g1["current"], g1["pending"]) == (0, 1)  # pending until a reset or a reboot
        # the reboot the report asks for: the process is gone, the mode takes effect, the unit creates the rest
        lab.host("gpu-1").reboot()
        assert devices(lab, "gpu-1") == {0: ["1g.10gb"] * 7, 1: ["1g.10gb"] * 7}
        ctx2 = context(lab, tmp_path, {"gpu-1": A100, "gpu-2": H200})
        assert Mig().run(ctx2).status == "unchanged"
        ctx2.close()
    finally:
        ctx.close()
