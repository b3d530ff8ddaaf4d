"""--skip-phases and --only-phase (kubeadm's phase selection) on install and upgrade: a wrong name is a usage error
that lists the phases, before any host is contacted; the lock is never left out; a left-out phase is shown as
skipped; install's prepare, left out, still reads every host and applies nothing."""

from __future__ import annotations

import json

import pytest

from gpuk8s import flows
from gpuk8s.inventory.loader import loads
from gpuk8s.phases.base import PhaseSelectionError, Skipped, select
from gpuk8s.phases.prepare import Prepare

INV = loads("hosts:\n  - {name: cp, address: 192.0.2.1, role: control-plane}\n"
            "  - {name: gpu-1, address: 192.0.2.2, role: worker, gpus: 8}\n")
INSTALL = ["lock", "prepare", "driver", "health", "mig", "init", "kubeconfig", "cni", "join", "gpu", "verify"]


def _names(phases: list) -> list[tuple[str, bool]]:
    return [(p.name, isinstance(p, Skipped)) for p in phases]


def test_install_s_phases_in_order() -> None:
    assert [p.name for p in flows.install_phases(INV)] == INSTALL


def test_skip_leaves_those_out_and_keeps_the_order() -> None:
    got = flows.select_install(INV, ["cni", "verify"], None)
    assert _names(got) == [(n, n in ("cni", "verify")) for n in INSTALL]


def test_only_runs_that_phase_after_the_lock_and_prepare_reads_without_applying() -> None:
    got = flows.select_install(INV, [], "gpu")
    assert [p.name for p in got if not isinstance(p, Skipped)] == ["lock", "prepare", "gpu"]
    prep = next(p for p in got if p.name == "prepare")
    assert isinstance(prep, Prepare) and prep.apply is False  # the facts and plans the gpu phase needs
    assert next(p for p in got if p.name == "verify").run(None).status == "skipped"  # type: ignore[arg-type]


def test_skipping_prepare_still_reads_the_hosts() -> None:
    prep = next(p for p in flows.select_install(INV, ["prepare"], None) if p.name == "prepare")
    assert isinstance(prep, Prepare) and prep.apply is False


@pytest.mark.parametrize(("skip", "only", "message"), [
    (["nope"], None, "install has no phase nope"),
    ([], "verfy", "install has no phase verfy"),
    (["lock"], None, "lock cannot be skipped"),
    (["cni"], "gpu", "--skip-phases and --only-phase together"),
])
def test_a_wrong_selection_is_refused_with_the_phases_named(skip: list[str], only: str | None, message: str) -> None:
    with pytest.raises(PhaseSelectionError, match=message) as e:
        flows.select_install(INV, skip, only)
    if "no phase" in message:
        assert e.value.remedy == "its phases, in order: " + ", ".join(INSTALL)


def test_upgrade_s_selection_names_its_own_phases() -> None:
    assert set(flows.select_upgrade(["upgrade-workers"], None)) == {"upgrade-workers"}
    assert set(flows.select_upgrade([], "verify")) == {"upgrade-prepare", "upgrade-control-planes",
                                                       "upgrade-workers", "upgrade-manifests"}
    with pytest.raises(PhaseSelectionError, match="upgrade has no phase cni"):
        flows.select_upgrade(["cni"], None)


def test_a_skipped_phase_plans_nothing() -> None:
    [p] = select([Prepare()], ["prepare"], None)
    assert isinstance(p, Skipped) and p.plan(None).changes == []  # type: ignore[arg-type]


def test_the_cli_refuses_a_wrong_phase_before_contacting_any_host(run_cli, tmp_path) -> None:
    f = tmp_path / "inv.yaml"
    f.write_text("hosts:\n  - {name: cp, address: 192.0.2.1, role: control-plane}\n")  # TEST-NET-1: never answers
    r = run_cli("install", "-i", str(f), "--skip-phases", "cni,nope", "-o", "json", timeout=30)
    assert r.returncode == 2, r.stdout + r.stderr
    out = json.loads(r.stdout)
    assert out["kind"] == "phase-selection" and "nope" in out["error"] and "lock, prepare" in out["remedy"]
    r = run_cli("upgrade", "-i", str(f), "--only-phase", "cni", "--yes", timeout=30)
    assert r.returncode == 2 and "upgrade has no phase cni" in r.stderr
