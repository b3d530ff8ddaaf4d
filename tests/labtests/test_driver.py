"""The driver's state, read by preflight in the same probe on the lab's hosts (docs/driver.md): a well-kept host,
an HGX board without fabric manager, a bare server (no driver, nouveau loaded) with and without
driver: {manage: true}, a host whose packages were upgraded without a reboot, loose packages and no persistenced."""

from __future__ import annotations

import json

FLEET = """
hosts:
  - {name: cp-1, role: control-plane}
  - {name: gpu-ok, gpus: 2}
  - {name: hgx, gpus: 8, gpu_model: "NVIDIA H100 80GB HBM3", nvswitches: 4, driver: "580.95.05", driver_flavor: open}
  - {name: bare, gpus: 4, gpu_model: "NVIDIA H100 80GB HBM3", driver: null, modules: [overlay, nouveau]}
  - {name: bare-managed, gpus: 4, gpu_model: "NVIDIA H100 80GB HBM3", driver: null, modules: [overlay, nouveau],
     driver_inventory: {manage: true}}
  - {name: upgraded, gpus: 2, driver: "570.124.06", driver_libraries: "570.195.03"}
  - {name: loose, gpus: 2, driver_held: false, persistenced: false}
"""


def test_preflight_reads_the_driver_state_in_its_one_probe(lab_up, run_cli):
    lab = lab_up(FLEET)
    r = run_cli("preflight", "-i", str(lab.inventory), "-o", "json", "--no-network")
    assert r.returncode == 1, r.stderr
    c = {h["name"]: {x["id"]: x for x in h["checks"]} for h in json.loads(r.stdout)["hosts"]}

    ok = c["gpu-ok"]
    assert {i: ok[i]["status"] for i in ok if i.startswith("driver.")} == {
        "driver.mismatch": "pass", "driver.nouveau": "pass", "driver.secure-boot": "skip",
        "driver.fabric-manager": "pass", "driver.persistence": "pass", "driver.held": "pass"}
    assert "535.104.05 (proprietary)" in ok["driver.mismatch"]["message"]

    hgx = c["hgx"]
    assert "580.95.05 (open)" in hgx["driver.mismatch"]["message"]  # /proc/driver/nvidia/version of open modules
    assert hgx["driver.fabric-manager"]["status"] == "fail"
    assert hgx["driver.fabric-manager"]["message"].startswith("4 NVSwitch(es) and no fabric manager")

    bare = c["bare"]  # the user's driver: preflight names what is missing and blocks it
    assert bare["gpu.driver"]["status"] == "fail" and "not installed" in bare["gpu.driver"]["message"]
    assert bare["driver.nouveau"]["status"] == "warn"
    assert "driver.plan" not in bare

    managed = c["bare-managed"]  # gpuk8s's driver: the plan from lspci's GPUs, the host not blocked by the driver
    assert managed["gpu.driver"]["status"] == "skip"
    assert "install installs the driver" in managed["gpu.driver"]["message"]
    assert managed["driver.plan"]["status"] == "pass"
    assert "branch 580, open modules (Turing or newer GPUs" in managed["driver.plan"]["message"]
    assert "install blacklists it" in managed["driver.nouveau"]["remedy"]

    up = c["upgraded"]  # nvidia-smi's real two-line mismatch text, and the versions that explain it
    assert up["gpu.driver"]["status"] == "fail" and "version mismatch" in up["gpu.driver"]["message"]
    assert up["driver.mismatch"]["status"] == "fail"
    assert "570.124.06 is loaded, but the driver's libraries are 570.195.03" in up["driver.mismatch"]["message"]

    loose = c["loose"]
    assert loose["driver.held"]["status"] == "warn" and "apt-mark hold nvidia-driver-535-server" in \
        loose["driver.held"]["remedy"]
    assert loose["driver.persistence"]["status"] == "warn"

    probes = [argv for argv in lab.host("gpu-ok").commands() if argv[:1] == ["lspci"]]
    assert len(probes) == 1  # lspci ran once, inside the one probe
