"""The fabric on the lab (issue 43): hosts with RDMA ports (the lab's /sys/class/infiniband, each file holding what
the kernel's sysfs holds, values as real ibstatus texts show them: tests/fixtures/real/fabric/ibstat), read by the
real probe over SSH; preflight names the host and the port that is down, and the one at a lower rate; a port
brought up is seen by the next run."""

from __future__ import annotations

import json

import yaml

from tests.labtests.test_preflight import checks_by_host

UP = {"state": "4: ACTIVE", "phys_state": "5: LinkUp", "link_layer": "InfiniBand", "sm_lid": "0x1"}
NDR, HDR = "400 Gb/sec (4X NDR)", "200 Gb/sec (4X HDR)"  # ibstatus-bf3-roce-200-hdr-400-ndr-deepep-17
DOWN = {"state": "1: DOWN", "phys_state": "3: Disabled", "rate": "40 Gb/sec (4X QDR)", "link_layer": "InfiniBand",
        "sm_lid": "0x1"}  # ibstatus-cx6dx-roce-disabled-100-edr-magnate3's down port's values
FLEET = yaml.safe_dump({"hosts": [
    {"name": "cp-1", "role": "control-plane"},
    {"name": "gpu-1", "gpus": 2, "rdma": [{"device": "mlx5_0", **UP, "rate": NDR}, {"device": "mlx5_1", **DOWN}]},
    {"name": "gpu-2", "gpus": 2, "rdma": [{"device": "mlx5_0", **UP, "rate": NDR},
                                          {"device": "mlx5_1", **UP, "rate": HDR}]},
]})


def test_preflight_names_the_port_down_and_the_port_slow(lab_up, run_cli, tmp_path):
    lab = lab_up(FLEET)
    doc = yaml.safe_load(lab.inventory.read_text())
    doc["gpu_defaults"] = {"fabric": {"link_layer": "infiniband", "expect": {"ports": 2, "rate": 400}}}
    inv = tmp_path / "inventory.yaml"
    inv.write_text(yaml.safe_dump(doc, sort_keys=False))

    def preflight() -> dict[str, dict[str, dict]]:
        r = run_cli("preflight", "-i", str(inv), "-o", "json", "--network-seconds", "0")
        assert r.stdout.strip(), r.stderr[-2000:]
        return checks_by_host(json.loads(r.stdout))

    c = preflight()
    one, two = c["gpu-1"], c["gpu-2"]
    assert one["fabric.ports"]["status"] == "fail", one["fabric.ports"]
    assert ("1 active InfiniBand port(s), fabric.expect.ports is 2; not active: mlx5_1 port 1 (Down/Disabled, "
            "40 Gb/s)") in one["fabric.ports"]["message"]
    assert two["fabric.ports"]["status"] == "pass" and two["fabric.rate"]["status"] == "fail"
    assert two["fabric.rate"]["message"] == "below the expected 400 Gb/s: mlx5_1 port 1 (Active/LinkUp, 200 Gb/s)"
    assert all(two[i]["status"] == "pass" for i in ("fabric.link-layer", "fabric.subnet-manager"))
    assert not any(i.startswith("fabric.") for i in c["cp-1"])  # no GPUs: no fabric
    # the cable replaced: gpu-1's port up at 400, seen by the next run
    lab.host("gpu-1").write_rdma([{"device": "mlx5_1", **UP, "rate": NDR}])
    c = preflight()
    assert {i: x["status"] for i, x in c["gpu-1"].items() if i.startswith("fabric.")} == {
        "fabric.ports": "pass", "fabric.link-layer": "pass", "fabric.subnet-manager": "pass", "fabric.rate": "pass"}
    assert c["gpu-1"]["fabric.rate"]["message"] == "2 x 400 Gb/s"
