"""Scenarios (issue 41, docs/testing.md): realistic inventories that combine features, installed once, then day-two
steps, with the invariants (tests/labtests/invariants.py) checked after every step.

hgx-day-one: bare HGX H100 servers with gpuk8s's driver, one cut into MIG (mixed, 2 x 3g.40gb per GPU), one on DRA
whose preinstalled 535 driver gpuk8s replaces by branch 580 (preflight blocked this composition: its dra.driver
floor looked at the running driver), one time-sliced, monitoring deployed (its exporter's MIG series were counted as
whole GPUs), on Kubernetes 1.36 (the default minor). Steps: install --allow-reboot, verify, the invariants, a
re-run that changes nothing, the invariants again.
"""

from __future__ import annotations

import json
import time
from typing import Any

from tests.labtests import invariants

HGX_DAY_ONE = """
cluster:
  kubernetes_version: "1.36"
hosts:
  - {name: cp-1, role: control-plane}
  - {name: mig-1, gpus: 2, gpu_model: "NVIDIA H100 80GB HBM3", gpu_memory_mib: 81559, nvswitches: 4, driver: null,
     modules: [overlay, nouveau], driver_inventory: {manage: true},
     mig_layout: {strategy: mixed, config: [{devices: all, mig-devices: {"3g.40gb": 2}}]}}
  - {name: dra-1, gpus: 2, gpu_model: "NVIDIA H100 80GB HBM3", gpu_memory_mib: 81559, driver: "535.104.05",
     driver_inventory: {manage: true, branch: "580"}, allocator: dra}
  - {name: ts-1, gpus: 2, gpu_model: "NVIDIA H100 80GB HBM3", gpu_memory_mib: 81559,
     gpu_sharing: {strategy: time-slicing, replicas: 4}}
"""


def timed(run_cli: Any, *args: str) -> tuple[int, dict[str, Any], float]:
    t0 = time.monotonic()
    r = run_cli(*args, "-o", "json", timeout=900)
    took = time.monotonic() - t0
    assert r.stdout, r.stderr[-3000:]
    return r.returncode, json.loads(r.stdout), took


def test_hgx_day_one(lab_up, run_cli, tmp_path):
    lab = lab_up(HGX_DAY_ONE)
    lab.inventory.write_text(lab.inventory.read_text() + "\nmonitoring:\n  enabled: true\n")
    inv = str(lab.inventory)
    kc = tmp_path / "kc"
    seconds: dict[str, float] = {}

    rc, rep, seconds["install"] = timed(run_cli, "install", "-i", inv, "--kubeconfig-out", str(kc), "--allow-reboot")
    assert rc == 0, json.dumps(rep)[-6000:]
    nodes = {n["node"]: n for n in rep["nodes"]}
    assert all(n["ok"] for n in nodes.values()), nodes
    assert "580." in lab.host("dra-1").exec("cat /proc/driver/nvidia/version").stdout
    planned = {"mig-1": {"nvidia.com/mig-3g.40gb": 4}, "dra-1": {"gpu": 2}, "ts-1": {"nvidia.com/gpu": 8}}
    # status counts DRA's GPUs with the GPUs (its footer's "GPUs in cluster"): 8 time-sliced + 2 on DRA
    totals = {"nvidia.com/mig-3g.40gb": 4, "nvidia.com/gpu": 10}
    invariants.all_hold(lab, run_cli, inv, planned, {"dra-1"}, totals)

    rc, rep, seconds["verify"] = timed(run_cli, "verify", "-i", inv)
    assert rc == 0, json.dumps(rep)[-6000:]
    mon = next(p for p in rep["phases"] if p["name"] == "monitoring-verify")["hosts"]
    assert mon["mig-1"] == "exporter dcgm-exporter-mig-1: 4 GPU(s) reported, as planned", mon  # 4 MIG instances

    rc, rep, seconds["re-run"] = timed(run_cli, "install", "-i", inv, "--kubeconfig-out", str(kc), "--allow-reboot")
    assert rc == 0 and not rep["changed"], json.dumps(rep)[-4000:]
    invariants.all_hold(lab, run_cli, inv, planned, {"dra-1"}, totals)
    print("hgx-day-one seconds:", {k: round(v, 1) for k, v in seconds.items()})
