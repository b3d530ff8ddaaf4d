"""gpuk8s health on the lab (issue 32): hosts whose simulated GPUs carry real faults (an Xid 79 and a GPU off the
bus, a pending row remap, a degraded PCIe link, an NVLink down, uncorrectable ECC errors), each read through the
real texts' layouts (tests/fixtures/real/health), named with its evidence while the healthy hosts pass; a GPU reset
and a reboot clear what they clear on a real GPU."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema

SCHEMA = json.loads((Path(__file__).resolve().parents[2] / "docs" / "health.schema.json").read_text())

FLEET = """
hosts:
  - name: cp-1
    role: control-plane
  - name: fine
    health: {nvlinks: 12}
  - name: fell
    health: {lost: [1], xid: [{gpu: 3, xid: 94}]}
  - name: remap
    health: {remap_pending: [2], ecc_uncorrected: {2: 3}, pcie_width: {0: 8}, nvlinks: 12, nvlink_down: {1: [4, 7]}}
"""


def by_host(report: dict) -> dict[str, dict[str, dict]]:
    return {h["name"]: {f["id"]: f for f in h["findings"]} for h in report["hosts"]}


def test_health_names_each_fault_with_its_evidence_and_passes_the_healthy(lab_up, run_cli):
    lab = lab_up(FLEET)
    r = run_cli("health", "-i", str(lab.inventory), "-o", "json")
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    rep = json.loads(r.stdout)
    jsonschema.validate(rep, SCHEMA)
    assert [h["name"] for h in rep["hosts"]] == ["fine", "fell", "remap"]  # GPU hosts only: the control plane has none
    got = by_host(rep)
    fine = got["fine"]
    assert all(f["status"] in ("pass", "skip") for f in fine.values()), fine
    assert fine["health.nvlink-down"]["status"] == "pass" and "48 links" in fine["health.nvlink-down"]["message"]
    assert {h["name"]: h["healthy"] for h in rep["hosts"]} == {"fine": True, "fell": False, "remap": False}

    fell = got["fell"]
    assert fell["health.gpu-count"]["status"] == "fail"
    assert "expects 4 GPU(s): nvidia-smi lists 3 GPU(s), lspci 4" in fell["health.gpu-count"]["message"]
    assert fell["health.xid"]["status"] == "fail" and "Xid 79 (GPU has fallen off the bus)" in \
        fell["health.xid"]["message"]
    assert "NVRM: Xid (PCI:0000:11:00): 79, GPU has fallen off the bus." in fell["health.xid"]["evidence"]
    assert fell["health.xid-app"]["status"] == "warn" and "Xid 94 (Contained memory error) x1" in \
        fell["health.xid-app"]["message"]

    remap = got["remap"]
    assert remap["health.row-remap-pending"]["status"] == "fail" and "GPU 2 (0000:12:00)" in \
        remap["health.row-remap-pending"]["message"]
    assert remap["health.ecc-uncorrected"]["status"] == "fail" and "GPU 2 (0000:12:00): 3" in \
        remap["health.ecc-uncorrected"]["message"]
    assert remap["health.pcie-width"]["status"] == "warn" and "x8 of x16" in remap["health.pcie-width"]["message"]
    assert remap["health.nvlink-down"]["status"] == "fail" and "GPU 1 link(s) 4, 7" in \
        remap["health.nvlink-down"]["message"]
    assert remap["health.xid"]["status"] == "pass"

    # one host by name; the table when piped names the failures and the verdict
    r = run_cli("health", "fine", "-i", str(lab.inventory))
    assert r.returncode == 0 and "HEALTHY: 1 host(s), 0 unhealthy" in r.stdout
    r = run_cli("health", "nope", "-i", str(lab.inventory))
    assert r.returncode == 2 and "no host nope in the inventory" in r.stderr

    # what a real GPU does: a reset activates the pending remap; a reboot brings the GPU back on the bus and
    # starts a new kernel log
    lab.hosts["remap"].exec("nvidia-smi -i 2 -r")
    lab.hosts["fell"].reboot()
    got = by_host(json.loads(run_cli("health", "fell", "remap", "-i", str(lab.inventory), "-o", "json").stdout))
    assert got["remap"]["health.row-remap-pending"]["status"] == "pass"
    assert got["fell"]["health.gpu-count"]["status"] == "pass" and got["fell"]["health.xid"]["status"] == "pass"
    assert got["fell"]["health.xid-app"]["status"] == "pass"


def test_health_of_a_host_that_is_down_is_named_and_the_others_go_on(lab_up, run_cli):
    lab = lab_up("hosts:\n  - name: cp-1\n    role: control-plane\n  - name: ok\n  - name: down\n"
                 "    faults: [sshd-stopped]\n")
    r = run_cli("health", "-i", str(lab.inventory), "-o", "json")
    jsonschema.validate(json.loads(r.stdout), SCHEMA)
    got = by_host(json.loads(r.stdout))
    assert r.returncode == 1
    assert got["down"]["ssh.reachable"]["status"] == "fail" and "refused" in got["down"]["ssh.reachable"]["message"]
    assert got["ok"]["health.gpu-count"]["status"] == "pass"


DCGM_FLEET = """
hosts:
  - name: cp-1
    role: control-plane
  - name: dcgm-ok
    health: {dcgm: "4.5.2"}
  - name: dcgm-bad
    health: {dcgm: "4.5.2", dcgm_fail: [1]}
  - name: no-dcgm
"""


def test_the_standard_level_runs_dcgms_diagnostic_where_dcgm_is_installed(lab_up, run_cli):
    """--level standard: dcgmi diag -r 2 -j on each GPU host after the quick level; its failing test named with
    DCGM's own warning; a host without DCGM says the diagnostic was not run (and stays healthy by the quick level)."""
    lab = lab_up(DCGM_FLEET)
    r = run_cli("health", "-i", str(lab.inventory), "--level", "standard", "-o", "json")
    assert "Traceback" not in r.stderr, r.stderr
    rep = json.loads(r.stdout)
    jsonschema.validate(rep, SCHEMA)
    assert rep["level"] == "standard" and r.returncode == 1
    got = by_host(rep)
    ok, bad, absent = got["dcgm-ok"]["health.dcgm-diag"], got["dcgm-bad"]["health.dcgm-diag"], \
        got["no-dcgm"]["health.dcgm-diag"]
    assert ok["status"] == "pass" and ok["message"].startswith("dcgmi diag -r 2 (DCGM 4.5.2, driver ")
    assert "12 result(s), none failed" in ok["message"]
    assert bad["status"] == "fail" and "1 result(s) failed: software (GPU 1): Persistence Mode: Persistence mode " \
        "for GPU 1 is disabled." in bad["message"]
    assert bad["evidence"][0].startswith("Deployment/software GPU 1: fail: Persistence Mode")
    assert absent["status"] == "skip" and "DCGM is not installed" in absent["message"]
    assert {h["name"]: h["healthy"] for h in rep["hosts"]} == {"dcgm-ok": True, "dcgm-bad": False, "no-dcgm": True}
    # the quick level never runs DCGM; the long one adds DCGM's diagnostic test
    quick = by_host(json.loads(run_cli("health", "dcgm-bad", "-i", str(lab.inventory), "-o", "json").stdout))
    assert "health.dcgm-diag" not in quick["dcgm-bad"]
    long = by_host(json.loads(run_cli("health", "dcgm-ok", "-i", str(lab.inventory), "--level", "long",
                                      "-o", "json").stdout))
    assert long["dcgm-ok"]["health.dcgm-diag"]["message"].startswith("dcgmi diag -r 3 (DCGM 4.5.2")
    assert "16 result(s)" in long["dcgm-ok"]["health.dcgm-diag"]["message"]
    r = run_cli("health", "-i", str(lab.inventory), "--level", "deep")
    assert r.returncode == 2 and "no level 'deep'" in r.stderr
