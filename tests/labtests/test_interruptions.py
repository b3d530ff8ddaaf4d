"""The interruption matrix (issue 41, docs/testing.md): on one composed cluster, each day-two command's client is
killed (SIGKILL) after each of its phases in turn, every run resuming what the one before left, until a run ends by
itself; then it must have converged: exit 0, the invariants (tests/labtests/invariants.py) hold, and a re-run of
install changes nothing.

The cluster (`mixed-day-two`): Ubuntu 22.04, containerd, Kubernetes 1.35; `ts-1` time-sliced x4, `mig-1` an A100 cut
into MIG (single, all-1g.10gb), `dra-1` on DRA (driver 580), and `spare` joined on day two. The commands, in a
realistic order: install, join `spare`, a MIG layout change (install again, mixed 3g.40gb, killed inside the mig
phase too), `upgrade` to 1.36 (before it, a move of `spare` to DRA is refused: its containerd 1.6 has no CDI),
`allocator` moving `spare` to DRA (killed right after its relabel too), `reset` of `spare`. The kill points are the
phase ends the log file shows (tests/labtests/interrupt.py), so that a new phase is met without a change here.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import lab_unavailable
from tests.labtests import interrupt, invariants

FLEET = """
cluster:
  kubernetes_version: "1.35"
hosts:
  - {name: cp-1, role: control-plane}
  - {name: ts-1, gpus: 2, gpu_sharing: {strategy: time-slicing, replicas: 4}}
  - {name: mig-1, gpus: 2, gpu_model: "NVIDIA A100-SXM4-80GB", gpu_memory_mib: 81920,
     mig_layout: {strategy: single, config: all-1g.10gb}}
  - {name: dra-1, gpus: 2, driver: "580.95.05", allocator: dra}
  - {name: spare, gpus: 2, driver: "580.95.05"}
"""
# 7 x 1g.10gb per A100 80GB under the single strategy (nvidia.com/gpu), 2 x 3g.40gb per GPU under mixed
BASE = {"ts-1": {"nvidia.com/gpu": 8}, "mig-1": {"nvidia.com/gpu": 14}, "dra-1": {"gpu": 2}}


class Cluster:
    """The lab, its inventory as the user edits it step by step, and what the plan offers after each step."""

    def __init__(self, lab: Any, tmp: Path) -> None:
        self.lab, self.tmp = lab, tmp
        self.doc = yaml.safe_load(lab.inventory.read_text())
        self.hosts = ["cp-1", "ts-1", "mig-1", "dra-1"]  # spare joins on day two
        self.planned: dict[str, dict[str, int]] = dict(BASE)
        self.dra = {"dra-1"}
        self.kc = str(tmp / "kc")

    def write(self) -> str:
        doc = {**self.doc, "hosts": [h for h in self.doc["hosts"] if h["name"] in self.hosts]}
        path = self.tmp / "inventory.yaml"
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        return str(path)

    def host(self, name: str) -> dict[str, Any]:
        return next(h for h in self.doc["hosts"] if h["name"] == name)

    def totals(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for want in self.planned.values():
            for res, n in want.items():
                key = "nvidia.com/gpu" if res == "gpu" else res  # status counts DRA's GPUs with the GPUs
                out[key] = out.get(key, 0) + n
        return out

    def invariants(self, run_cli: Any, inventory: str) -> None:
        invariants.all_hold(self.lab, run_cli, inventory, self.planned, self.dra, self.totals())


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    reason = lab_unavailable()
    if reason:
        pytest.skip(reason)
    from tests.lab.lab import Lab

    tmp = tmp_path_factory.mktemp("interruptions")
    (tmp / "fleet.yaml").write_text(FLEET)
    lab = Lab()
    lab.up(tmp / "fleet.yaml")
    try:
        yield Cluster(lab, tmp)
    finally:
        lab.down()


def converged(c: Cluster, run_cli: Any, args: tuple[str, ...], runs: list[interrupt.Kill]) -> None:
    """The chain's last run ended by itself with exit 0; the invariants hold; install again changes nothing."""
    where = [r.where() for r in runs]
    print(f"{' '.join(args[:2])}: {len(runs) - 1} kill(s): {where}")
    assert len(runs) >= 2, f"{args}: never killed: {where}"
    assert runs[-1].rc == 0, f"{args}: the run after the kills failed (exit {runs[-1].rc}); kills: {where}; " \
        f"its log: {runs[-1].log.read_text()[-6000:]}"
    inv = args[args.index("-i") + 1]
    c.invariants(run_cli, inv)
    r = run_cli("install", "-i", inv, "--kubeconfig-out", c.kc, "--allow-reboot", "-o", "json", timeout=600)
    rep = json.loads(r.stdout)
    assert r.returncode == 0 and not rep["changed"], \
        [(p["name"], p["status"], p["message"]) for p in rep["phases"] if p["status"] != "unchanged"]


def test_install_killed_after_every_phase(cluster, run_cli):
    c = cluster
    inv = c.write()
    args = ("install", "-i", inv, "--kubeconfig-out", c.kc, "--allow-reboot", "-o", "json")
    runs = interrupt.every_phase_end(c.tmp, args)
    phases = runs[-1].phases
    assert {"lock", "prepare", "mig", "init", "join", "gpu", "verify"} <= set(phases) or len(runs) > 10, where(runs)
    converged(c, run_cli, args, runs)


def test_join_killed_after_every_phase(cluster, run_cli):
    c = cluster
    c.hosts.append("spare")
    c.planned["spare"] = {"nvidia.com/gpu": 2}
    inv = c.write()
    runs = interrupt.every_phase_end(c.tmp, ("join", "-i", inv, "-o", "json"))
    converged(c, run_cli, ("join", "-i", inv), runs)


def test_mig_layout_change_killed_after_every_phase_and_inside_the_mig_phase(cluster, run_cli):
    c = cluster
    c.host("mig-1")["mig"] = {"strategy": "mixed", "config": [{"devices": "all", "mig-devices": {"3g.40gb": 2}}]}
    c.planned["mig-1"] = {"nvidia.com/mig-3g.40gb": 4}
    inv = c.write()
    args = ("install", "-i", inv, "--kubeconfig-out", c.kc, "--allow-reboot", "-o", "json")
    # inside the mig phase: as it starts (health's end), its mig-apply on mig-1 in flight
    inside = interrupt.run_killed(c.tmp, args, line=re.compile(r"gpuk8s\.phases: phase health: "), delay=0.3)
    runs = [inside, *interrupt.every_phase_end(c.tmp, args)]
    converged(c, run_cli, args, runs)


def test_upgrade_killed_after_every_phase(cluster, run_cli):
    c = cluster
    # first, on 1.35, spare's containerd (1.6) has no CDI: a move to DRA is refused before anything changes (it
    # drained the node, failed its proof and put it back)
    c.host("spare")["allocator"] = "dra"
    r = run_cli("allocator", "spare", "--to", "dra", "-i", c.write(), "--yes", "-o", "json")
    refused = "spare: not moved to dra: its containerd 1.6.20 does not hand CDI devices"
    assert r.returncode == 1 and refused in r.stdout, r.stdout[-3000:]
    del c.host("spare")["allocator"]
    invariants.none_cordoned(c.lab)
    c.doc["cluster"]["kubernetes_version"] = "1.36"
    inv = c.write()
    runs = interrupt.every_phase_end(c.tmp, ("upgrade", "-i", inv, "--to", "1.36", "--yes", "-o", "json"))
    converged(c, run_cli, ("upgrade", "-i", inv), runs)


def test_allocator_move_killed_after_every_phase_and_after_the_relabel(cluster, run_cli):
    c = cluster
    c.host("spare")["allocator"] = "dra"
    c.planned["spare"] = {"gpu": 2}
    c.dra.add("spare")
    inv = c.write()
    args = ("allocator", "spare", "--to", "dra", "-i", inv, "--yes", "-o", "json")
    relabel = re.compile(r"gpuk8s\.remote: cp-1: \$ .*label node spare .*gpu-allocator=dra")
    after_relabel = interrupt.run_killed(c.tmp, args, line=relabel)
    runs = [after_relabel, *interrupt.every_phase_end(c.tmp, args)]
    converged(c, run_cli, args, runs)


def test_reset_of_a_node_killed_after_every_phase(cluster, run_cli):
    c = cluster
    inv = c.write()
    runs = interrupt.every_phase_end(c.tmp, ("reset", "spare", "-i", inv, "--yes", "-o", "json"))
    c.hosts.remove("spare")
    del c.planned["spare"]
    c.dra.discard("spare")
    converged(c, run_cli, ("reset", "-i", c.write()), runs)


def where(runs: list[interrupt.Kill]) -> list[str]:
    return [r.where() for r in runs]
