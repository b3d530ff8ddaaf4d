"""Health before a node joins (issue 32): the health phase's policies (quarantine, skip, fail) on judged facts from
real texts, the quarantine taint in kubeadm's JoinConfiguration and in the gpu phase, verify's verdict on a
quarantined node, `gpuk8s health --release`, the inventory's health section and preflight's gpu.count left to the
health phase."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuk8s import gpuplan
from gpuk8s.facts.fabric import RdmaPort
from gpuk8s.facts.health import HealthFacts, health_facts
from gpuk8s.findings import passed as findings_passed
from gpuk8s.health.checks import judge, judge_dcgm
from gpuk8s.health.release import release_with
from gpuk8s.health.run import HealthReport, HostHealth
from gpuk8s.install.prepare import blocking_checks
from gpuk8s.inventory import InventoryError, loads
from gpuk8s.inventory.model import Cluster, HealthSettings, Host, Inventory, SSHSettings
from gpuk8s.kube import render, state
from gpuk8s.kube.state import NodeCheck
from gpuk8s.phases import health as phase
from gpuk8s.phases.base import Context
from gpuk8s.phases.gpu import node_changes
from gpuk8s.preflight.result import failed, passed
from tests.unit.fakekube import FakeKube
from tests.unit.test_checks import facts
from tests.unit.test_health import real

CP = Host("cp", "10.0.0.10", "control-plane", SSHSettings())
GOOD, BAD, REMAP = (Host(n, f"10.0.0.{i}", "worker", SSHSettings(), gpus=8)
                    for i, n in ((11, "good"), (12, "bad"), (13, "remap")))
QUARANTINE = "gpuk8s.io/quarantine"


def h100(kernel: str = "") -> HealthFacts:
    return health_facts((0, real("smi-q-h100x8-535-hw-slowdown-gpud.txt")),
                        (0, real("nvlink-s-a100x8-all-up-gpud.txt")), (0, kernel))


def remapping() -> HealthFacts:
    text = real("smi-q-h100x8-535-hw-slowdown-gpud.txt")
    # the A10's pending remap (real text) on the H100's first GPU: the remap block's lines as nvidia-smi prints them
    a10 = real("smi-q-a10-535-remap-pending-gpud.txt")
    block = a10[a10.index("    Remapped Rows"):a10.index("    Temperature")]
    start = text.index("    Remapped Rows")
    return health_facts((0, text[:start] + block + text[text.index("    Temperature", start):]),
                        (0, real("nvlink-s-a100x8-all-up-gpud.txt")), (0, ""))


class Session:
    def __init__(self, host: Host) -> None:
        self.host, self.closed = host, False

    def close(self) -> None:
        self.closed = True


def context(policy: str = "quarantine", *, before: str = "quick", cp: Host = CP,
            joined: tuple[str, ...] = ()) -> Context:
    hosts = (cp, GOOD, BAD, REMAP)
    inv = Inventory(Path("inventory.yaml"), Cluster(), SSHSettings(), hosts,
                    health=HealthSettings(before, policy))  # type: ignore[arg-type]
    kube = FakeKube()
    for n in joined:
        kube.add_node(n)
    f = {h.name: facts() for h in hosts}
    readings = {"good": h100(), "bad": h100(real("kernel-xid-79-no-pid-journalctl-pop-3363.txt")),
                "remap": remapping(), cp.name: h100(real("kernel-xid-79-no-pid-journalctl-pop-3363.txt"))}
    return Context(inv, sessions={h.name: Session(h) for h in hosts}, facts=f,  # type: ignore[misc]
                   health={n: (f[n], r) for n, r in readings.items()}, kube_client=kube,
                   initialized_cache=bool(joined), plans=gpuplan.plans(inv, f))


def test_the_remap_reading_is_the_real_a10_block() -> None:
    assert [g.remap_pending for g in remapping().gpus][:2] == [True, False]


def test_quarantine_joins_the_unhealthy_with_the_cause_and_its_evidence() -> None:
    ctx = context()
    r = phase.Health().run(ctx)
    assert r.status == "passed" and not r.stop
    assert ctx.quarantine == {"bad": "health.xid", "remap": "health.row-remap-pending"}
    assert r.hosts["good"] == "healthy"
    assert r.hosts["bad"].startswith("quarantined (gpuk8s.io/quarantine=health.xid:NoSchedule): health.xid: ")
    assert r.message == ("1 of 3 GPU host(s) healthy; quarantined: bad (health.xid), remap "
                         "(health.row-remap-pending)")
    assert "gpuk8s health --release bad remap" in r.remedy
    xid = next(f for f in ctx.findings if f.id == "health.xid")
    assert xid.subject is not None and xid.subject.name == "bad"
    assert xid.evidence == ("NVRM: Xid (PCI:0000:01:00): 79, GPU has fallen off the bus.",)
    assert set(ctx.sessions) == {"cp", "good", "bad", "remap"} and not ctx.held


def test_skip_leaves_the_unhealthy_out_and_the_others_go_on() -> None:
    ctx = context("skip")
    bad = ctx.sessions["bad"]
    r = phase.Health().run(ctx)
    assert r.status == "failed" and not r.stop and not phase.Health.fatal
    assert set(ctx.held) == {"bad", "remap"} and "bad" not in ctx.sessions and bad.closed  # type: ignore[attr-defined]
    assert ctx.held["bad"].startswith("GPU health failed: health.xid: ") and not ctx.quarantine
    assert r.hosts["bad"].startswith("not joined: health.xid") and "not joined: bad, remap" in r.message


def test_fail_stops_the_run_before_any_host_joins() -> None:
    ctx = context("fail")
    r = phase.Health().run(ctx)
    assert r.status == "failed" and r.stop and not ctx.quarantine
    assert "unhealthy: bad, remap: the run stops before any host joins" in r.message
    assert "gpuk8s health bad remap" in r.remedy


def test_the_first_control_plane_cannot_be_skipped_so_it_is_quarantined() -> None:
    cp = Host("cp", "10.0.0.10", "control-plane", SSHSettings(), gpus=8)
    ctx = context("skip", cp=cp)
    r = phase.Health().run(ctx)
    assert ctx.quarantine["cp"] == "health.xid" and "cp" not in ctx.held and "cp" in ctx.sessions
    assert r.hosts["cp"].startswith("quarantined")
    ctx = context("fail", cp=cp)
    assert phase.Health().run(ctx).stop


def test_nodes_already_joined_are_not_judged_and_off_judges_none() -> None:
    ctx = context(joined=("cp", "bad", "remap"))
    r = phase.Health().run(ctx)
    assert r.hosts == {"good": "healthy"} and not ctx.quarantine
    ctx = context(before="off")
    assert phase.Health().run(ctx).status == "skipped" and not ctx.quarantine
    assert phase.Health().plan(ctx).status == "unchanged"


def test_a_host_whose_facts_were_read_again_is_probed_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """The driver phase re-reads a host's facts after installing a driver: preflight's reading is stale for it."""
    ctx = context()
    ctx.facts["bad"] = facts()  # another object: read again after preflight
    probed: list[str] = []

    def check_session(s: Any, level: str = "quick") -> HostHealth:
        probed.append(f"{s.host.name}:{level}")
        return HostHealth(s.host, reachable=True, facts=ctx.facts["bad"], health=h100(), findings=[])

    monkeypatch.setattr(phase, "check_session", check_session)
    r = phase.Health().run(ctx)
    assert probed == ["bad:quick"] and r.hosts["bad"] == "healthy" and "bad" not in ctx.quarantine


def test_the_plan_names_what_the_run_would_do_and_records_it_for_the_later_plans() -> None:
    ctx = context("skip")
    p = phase.Health().plan(ctx)
    assert p.status == "would-change" and p.reason.endswith("1 of 3 GPU host(s) healthy; not joined: bad, remap")
    changes = {c.host: c.what for c in p.changes}
    assert changes["bad"].startswith("bad: would not be joined: health.xid: ") and "good" not in changes
    # held in the plan as in the run, but a dry run closes no connection: join's plan leaves them out
    assert set(ctx.held) == {"bad", "remap"} and "bad" in ctx.sessions
    from gpuk8s.phases.join import Join
    joins = [c.host for c in Join().plan(ctx).changes if c.what.startswith("kubeadm join")]
    assert joins == ["good"]
    ctx = context()
    p = phase.Health().plan(ctx)
    assert ctx.quarantine == {"bad": "health.xid", "remap": "health.row-remap-pending"}
    assert {c.host: c.what for c in p.changes}["bad"].startswith(
        "bad: would be quarantined (gpuk8s.io/quarantine=health.xid:NoSchedule)")
    # join's plan shows the JoinConfiguration with the taint
    from gpuk8s.phases.join import Join
    stdin = {c.host: c.stdin for c in Join().plan(ctx).changes if c.what.startswith("kubeadm join")}
    assert "gpuk8s.io/quarantine" in stdin["bad"] and "gpuk8s.io/quarantine" not in stdin["good"]


def test_a_host_read_without_root_is_held_not_quarantined(monkeypatch: pytest.MonkeyPatch) -> None:
    """A fresh reading that ran without sudo (the kernel log may be unreadable) judges nothing: held back."""
    from gpuk8s.findings import failed as fail
    ctx = context()
    ctx.facts["bad"] = facts()

    def check_session(s: Any, level: str = "quick") -> HostHealth:
        return HostHealth(s.host, reachable=True, facts=ctx.facts["bad"], health=h100(), findings=[
            fail("ssh.sudo", "sudo asks gpuk8s for a password", "set ssh.sudo.mode")])

    monkeypatch.setattr(phase, "check_session", check_session)
    r = phase.Health().run(ctx)
    assert "bad" not in ctx.quarantine and ctx.held["bad"].startswith("its GPU health could not be read: ssh.sudo")
    assert r.status == "failed" and r.hosts["bad"].startswith("not checked: ssh.sudo")


def test_a_quarantined_worker_registers_with_the_taint_and_a_control_plane_keeps_kubeadms() -> None:
    inv = Inventory(Path("i.yaml"), Cluster(), SSHSettings(), (CP, GOOD))
    t = gpuplan.quarantine_taint("health.xid")
    doc = yaml.safe_load(render.join_config(inv, GOOD, "10.0.0.10:6443", "t", "sha256:x", None, [t]))
    assert doc["nodeRegistration"]["taints"] == [{"key": QUARANTINE, "value": "health.xid", "effect": "NoSchedule"}]
    cp2 = Host("cp-2", "10.0.0.9", "control-plane", SSHSettings())
    doc = yaml.safe_load(render.join_config(inv, cp2, "10.0.0.10:6443", "t", "sha256:x", "key", [t]))
    assert doc["nodeRegistration"]["taints"][0] == {"key": "node-role.kubernetes.io/control-plane",
                                                    "effect": "NoSchedule"}
    # the first control plane: in kubeadm init's InitConfiguration, kubeadm's own taint kept
    init = next(yaml.safe_load_all(render.kubeadm_init_config(inv, CP, "v1.36.0", None, None, [t])))
    assert init["nodeRegistration"]["taints"] == [
        {"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"},
        {"key": QUARANTINE, "value": "health.xid", "effect": "NoSchedule"}]
    assert "taints" not in next(yaml.safe_load_all(render.kubeadm_init_config(inv, CP, "v1.36.0", None, None)))[
        "nodeRegistration"]
    # no quarantine: kubeadm's defaults (no taints key at all)
    assert "taints" not in yaml.safe_load(render.join_config(inv, GOOD, "a:6443", "t", "sha256:x"))["nodeRegistration"]


def test_the_gpu_phase_adds_the_quarantine_once_and_never_overwrites_it() -> None:
    ctx = context()
    plan = ctx.plans["bad"]
    kube = FakeKube()
    kube.add_node("bad")
    _, taints = node_changes(plan, state.node_state(kube.nodes["bad"]), "health.xid")
    assert taints == ["gpuk8s.io/quarantine=health.xid:NoSchedule"]
    kube.add_node("bad", taints=[{"key": QUARANTINE, "value": "health.ecc-uncorrected", "effect": "NoSchedule"}])
    _, taints = node_changes(plan, state.node_state(kube.nodes["bad"]), "health.xid")
    assert taints == []
    assert state.quarantined(kube.nodes["bad"]) == "health.ecc-uncorrected"
    assert state.quarantined(None) == "" and state.quarantined({"metadata": {"name": "x"}, "spec": "bad"}) == ""


def test_verify_names_a_quarantined_node_without_failing_on_it() -> None:
    ok = NodeCheck("good", True, True, 8, 8, pod="gpuk8s-verify-good")
    held = NodeCheck("bad", False, True, 8, 7, cause="7 of 8", cause_id="gpu.fewer-registered",
                     quarantine="health.xid")
    f = held.finding()
    assert (f.id, f.status) == ("node.quarantined", "warn")
    assert f.message.startswith("quarantined (health.xid): no test pod; 7 of 8 GPU(s) allocatable (7 of 8)")
    assert "gpuk8s health --release bad" in f.remedy
    assert state.summary([ok, held]) == "1/2 nodes ok, 8 GPU(s) schedulable, 1 quarantined (bad)"


def report(*hosts: tuple[Host, bool]) -> HealthReport:
    from gpuk8s.findings import failed as fail
    from gpuk8s.findings import passed as ok_
    return HealthReport([HostHealth(h, reachable=True, findings=[ok_("health.xid", "no Xid")] if ok else [
        fail("health.xid", "Xid 79", "reboot")]) for h, ok in hosts], "quick", 0.1)


def test_release_removes_only_a_healthy_nodes_quarantine() -> None:
    kube = FakeKube()
    q = [{"key": QUARANTINE, "value": "health.xid", "effect": "NoSchedule"}]
    kube.add_node("good", taints=q)
    kube.add_node("bad", taints=q)
    kube.add_node("remap")
    rep = report((GOOD, True), (BAD, False), (REMAP, True), (CP, True))
    release_with(kube, rep)  # type: ignore[arg-type]
    got = {h.host.name: h.findings[-1] for h in rep.hosts}
    assert kube.writes == [("taint", "good", "gpuk8s.io/quarantine:NoSchedule-")]
    assert got["good"].status == "pass"
    assert got["good"].message.startswith("released: the quarantine taint (health.xid)")
    assert got["bad"].status == "fail" and got["bad"].message == ("kept in quarantine (health.xid): its GPUs fail the "
                                                                  "check now (health.xid)")
    assert (got["remap"].status, got["remap"].message) == ("pass", "not quarantined")
    assert got["cp"].status == "skip" and not rep.ok


def test_release_of_a_fabric_quarantine_names_the_command_that_can_release_it() -> None:
    """A node the fabric level put in quarantine is released by that level only; one verify --fabric put there, by
    verify --fabric --quarantine: each says so instead of "the check ... did not run now"."""
    for was, level, said, remedy in (
            ("health.rdma-links", "quick", "the quick level does not run it", "--level fabric"),
            ("fabric.nccl-pairs", "fabric", "gpuk8s verify --fabric put it there", "verify --fabric --quarantine")):
        kube = FakeKube()
        kube.add_node("good", taints=[{"key": QUARANTINE, "value": was, "effect": "NoSchedule"}])
        rep = report((GOOD, True))
        rep.level = level
        release_with(kube, rep)  # type: ignore[arg-type]
        f = rep.hosts[0].findings[-1]
        assert f.status == "fail" and said in f.message and remedy in f.remedy, f
        assert kube.writes == []


def test_release_keeps_a_dcgm_quarantine_below_the_standard_level_and_names_a_failed_taint() -> None:
    kube = FakeKube()
    kube.add_node("good", taints=[{"key": QUARANTINE, "value": "health.dcgm-diag", "effect": "NoSchedule"}])
    rep = report((GOOD, True))
    release_with(kube, rep)  # type: ignore[arg-type]
    f = rep.hosts[0].findings[-1]
    assert f.status == "fail" and "DCGM's diagnostic put it there" in f.message and "--level standard" in f.remedy
    assert kube.writes == []
    rep = report((GOOD, True))
    rep.level = "standard"
    rep.hosts[0].findings.append(findings_passed("health.dcgm-diag", "dcgmi diag -r 2: none failed"))
    release_with(kube, rep)  # type: ignore[arg-type]
    assert kube.writes == [("taint", "good", "gpuk8s.io/quarantine:NoSchedule-")]

    class Refusing(FakeKube):
        def taint(self, node: str, taints: list[str]) -> None:
            from gpuk8s.kube.client import KubeError
            if node == "bad":
                raise KubeError("Error from server (Forbidden)")
            super().taint(node, taints)

    kube = Refusing()
    q = [{"key": QUARANTINE, "value": "health.xid", "effect": "NoSchedule"}]
    kube.add_node("bad", taints=q)
    kube.add_node("good", taints=q)
    rep = report((BAD, True), (GOOD, True))
    release_with(kube, rep)  # type: ignore[arg-type]
    got = {h.host.name: h.findings[-1] for h in rep.hosts}
    assert got["bad"].status == "fail" and "kubectl taint failed" in got["bad"].message
    assert got["good"].message.startswith("released")  # one node's refusal is its own


def test_the_inventory_health_section() -> None:
    base = "hosts:\n  - {name: cp-1, address: 10.0.0.10, role: control-plane}\n"
    inv = loads(base + "health: {before_join: off, on_failure: skip}\n", "inv.yaml")
    assert inv.health == HealthSettings("off", "skip")
    assert loads(base, "inv.yaml").health == HealthSettings("quick", "quarantine")
    assert loads(base + "health: {before_join: long}\n", "inv.yaml").health.before_join == "long"
    with pytest.raises(InventoryError) as e:
        loads(base + "health:\n  on_failure: evict\n  when: always\n", "inv.yaml")
    msgs = {(p.line, p.key): (p.message, p.fix) for p in e.value.problems}
    assert msgs[4, "health.on_failure"][0] == "'evict' is not one of quarantine, skip, fail"
    assert (5, "health.when") in msgs


def test_a_missing_gpu_is_the_health_phases_to_judge_where_it_runs() -> None:
    checks = [passed("ssh.reachable", "x"), failed("gpu.count", "7 of 8", "check the bus")]
    assert [c.id for c in blocking_checks(checks)] == ["gpu.count"]
    assert blocking_checks(checks, health=True) == []
    other = [*checks, failed("gpu.driver", "not installed", "install it")]
    assert [c.id for c in blocking_checks(other, health=True)] == ["gpu.driver"]


def test_preflight_reads_the_health_sections_only_of_gpu_hosts_not_yet_nodes(monkeypatch: pytest.MonkeyPatch) -> None:
    from gpuk8s.health.run import EXTRA
    from gpuk8s.phases import prepare as prep
    from gpuk8s.phases.prepare import health_sections
    ctx = context(joined=("cp", "bad", "remap"))
    # its own kubectl over the first control plane's connection, not the context's (nothing cached before preflight)
    monkeypatch.setattr(prep, "SSHKubectl", lambda s: ctx.kube_client if s is ctx.sessions["cp"] else None)
    ctx.initialized_cache = None
    ctx.kube_client.nodes["remap"]["spec"]["taints"] = [  # type: ignore[union-attr]
        {"key": QUARANTINE, "value": "health.xid", "effect": "NoSchedule"}]
    extra, quarantined = health_sections(ctx)
    assert extra is not None and quarantined == {"remap"}
    assert {h.name: extra(h) == EXTRA for h in ctx.inv.hosts} == {"cp": False, "good": True, "bad": False,
                                                                  "remap": False}
    assert health_sections(context(before="off")) == (None, set())
    assert ctx.initialized_cache is None and ctx.api_problem == ""  # the playbooks may change what init sees
    # a missing GPU blocks preparation where the health phase will not judge it (a node), not where it will or
    # where the node is in quarantine already
    checks = [failed("gpu.count", "7 of 8", "check the bus")]
    assert blocking_checks(checks, health=bool(extra(BAD))) != [] and blocking_checks(checks, bool(extra(GOOD))) == []


def test_skipping_the_health_phase_tells_prepare() -> None:
    from gpuk8s import flows
    from gpuk8s.phases.prepare import Prepare
    inv = Inventory(Path("inventory.yaml"), Cluster(), SSHSettings(), (CP, GOOD))
    prep = [p for p in flows.select_install(inv, ["health"], None) if isinstance(p, Prepare)]
    assert len(prep) == 1 and prep[0].health is False
    prep = [p for p in flows.select_install(inv, [], "verify") if isinstance(p, Prepare)]
    assert prep[0].health is False  # --only-phase verify: prepare reads, health does not run
    prep = [p for p in flows.select_install(inv, [], None) if isinstance(p, Prepare)]
    assert prep[0].health is True


def test_only_flows_with_the_health_phase_read_its_sections() -> None:
    from gpuk8s import flows
    from gpuk8s.phases.prepare import Prepare
    assert [p.health for p in flows.join_phases() if isinstance(p, Prepare)] == [True]
    assert Prepare().health is False  # doctor --fix's prepare: no health phase after it, gpu.count blocks


def test_a_quarantined_node_and_a_judged_host_are_lenient_a_plain_node_is_not() -> None:
    from gpuk8s.phases.prepare import lenient
    ok = lenient(lambda h: "sections" if h.name == "good" else "", {"remap"})
    assert (ok(GOOD), ok(REMAP), ok(BAD)) == (True, True, False)
    assert lenient(None, set())(GOOD) is False


def test_unreadable_nodes_stop_the_run_before_any_host_joins_unjudged() -> None:
    from gpuk8s.kube.client import KubeError

    class Down(FakeKube):
        def get(self, kind: str, *a: Any, **kw: Any) -> list[dict[str, Any]]:
            raise KubeError("The connection to the server 10.0.0.10:6443 was refused")

    ctx = context(joined=("cp",))
    ctx.kube_client = Down()
    r = phase.Health().run(ctx)
    assert r.status == "failed" and r.stop and "could not be read, so no host was judged" in r.message
    assert not ctx.quarantine


def test_a_dry_run_judges_a_host_whose_driver_gpuk8s_installs_after_the_driver_phase() -> None:
    from dataclasses import replace as rep

    from gpuk8s.facts.model import GPUInfo
    from gpuk8s.inventory.model import DriverSettings
    ctx = context()
    bare = rep(GOOD, gpu=rep(GOOD.gpu, driver=DriverSettings(manage=True)))
    ctx.inv = rep(ctx.inv, hosts=tuple(bare if h.name == "good" else h for h in ctx.inv.hosts))
    ctx.facts["good"] = rep(ctx.facts["good"], gpu=GPUInfo("absent", "", None, "", ()))
    p = phase.Health().plan(ctx)
    assert "1 host(s) judged once the driver phase has installed their driver: good" in p.reason
    assert "good" not in ctx.quarantine and "good" not in {c.host for c in p.changes}


@pytest.mark.parametrize(("taint", "level", "reading", "dcgm"), [
    # quarantined for ECC while `nvidia-smi -q` timed out now: health.ecc-uncorrected skipped, nothing failed
    ("health.ecc-uncorrected", "quick", health_facts((124, "timed out after 20 s"), (0, ""), (0, "")), False),
    # quarantined for an Xid while the kernel log cannot be read now (dmesg_restrict): health.xid skipped
    ("health.xid", "quick", health_facts((0, real("smi-q-h100x8-535-hw-slowdown-gpud.txt")), (0, ""),
                                         (1, "dmesg: read kernel buffer failed: Operation not permitted")), False),
    # quarantined by DCGM, released with --level standard on a host where dcgmi is gone: health.dcgm-diag skipped
    ("health.dcgm-diag", "standard", h100(), True),
])
def test_release_needs_the_check_named_in_the_taint_to_have_run_and_passed(
        taint: str, level: str, reading: HealthFacts, dcgm: bool) -> None:
    kube = FakeKube()
    kube.add_node("good", taints=[{"key": QUARANTINE, "value": taint, "effect": "NoSchedule"}])
    found = judge(GOOD, facts(), reading) + ([judge_dcgm(level, None)] if dcgm else [])
    assert all(f.ok for f in found) and next(f for f in found if f.id == taint).status == "skip"
    rep = HealthReport([HostHealth(GOOD, reachable=True, findings=found)], level, 0.1)
    release_with(kube, rep)  # type: ignore[arg-type]
    f = rep.hosts[0].findings[-1]
    assert kube.writes == [] and f.status == "fail"
    assert f.message.startswith(f"kept in quarantine ({taint}): the check that put it there did not pass now (skip")
    assert "kubectl taint nodes good gpuk8s.io/quarantine:NoSchedule-" in f.remedy


def test_release_of_a_taint_naming_no_check_is_kept() -> None:
    kube = FakeKube()
    kube.add_node("good", taints=[{"key": QUARANTINE, "effect": "NoSchedule"}])
    rep = report((GOOD, True))
    release_with(kube, rep)  # type: ignore[arg-type]
    assert kube.writes == [] and rep.hosts[0].findings[-1].message == (
        "kept in quarantine (unknown): the check that put it there (unknown) did not run now")


def test_the_fabric_level_gates_a_host_whose_rdma_port_counts_errors() -> None:
    """health.before_join: fabric (issue 43): the quick level plus the fabric's ports and their error counters; a
    host whose port counts symbol errors is quarantined for it before it joins, a clean one joins."""
    inv = loads("hosts:\n  - {name: cp, address: 10.0.0.10, role: control-plane}\n"
                "  - {name: g1, address: 10.0.0.11, gpus: 8, fabric: {link_layer: infiniband}}\n"
                "  - {name: g2, address: 10.0.0.12, gpus: 8, fabric: {link_layer: infiniband}}\n"
                "health: {before_join: fabric}\n", "inv.yaml")
    up = RdmaPort("mlx5_0", 1, "Active", "LinkUp", 400.0, "InfiniBand")
    f = {h.name: facts(rdma=(up,)) for h in inv.hosts}
    clean = dataclasses.replace(h100(), rdma_counters={("mlx5_0", 1): {"symbol_error": 0}})
    errors = dataclasses.replace(h100(), rdma_counters={("mlx5_0", 1): {"symbol_error": 9, "link_downed": 1}})
    ctx = Context(inv, sessions={h.name: Session(h) for h in inv.hosts}, facts=f,  # type: ignore[misc]
                  health={"g1": (f["g1"], clean), "g2": (f["g2"], errors)}, kube_client=FakeKube(),
                  initialized_cache=False, plans=gpuplan.plans(inv, f))
    r = phase.Health().run(ctx)
    assert ctx.quarantine == {"g2": "health.rdma-links"}, r.hosts
    assert r.hosts["g1"] == "healthy"
    assert r.hosts["g2"].endswith("health.rdma-links: mlx5_0: symbol_error 9, link_downed 1")
    # the quick level does not read the counters: the same host passes it
    quick = Context(dataclasses.replace(inv, health=HealthSettings("quick", "quarantine")),
                    sessions={h.name: Session(h) for h in inv.hosts}, facts=f,  # type: ignore[misc]
                    health={"g1": (f["g1"], clean), "g2": (f["g2"], errors)}, kube_client=FakeKube(),
                    initialized_cache=False, plans=gpuplan.plans(inv, f))
    phase.Health().run(quick)
    assert quick.quarantine == {}
