"""Every cluster phase's plan (what --dry-run shows) against a fake Kubernetes API and fake facts, no SSH;
and the manifests: applied when, and only when, the sha256 of their rendered text changed."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import yaml

from gpuk8s import gpuplan
from gpuk8s.inventory.loader import loads
from gpuk8s.kube import manifests
from gpuk8s.phases.base import Context, Options, plan_phases
from gpuk8s.phases.cni import CNI
from gpuk8s.phases.gpu import GPUNodes
from gpuk8s.phases.init import Init
from gpuk8s.phases.join import Join
from gpuk8s.phases.kubeconfig import Kubeconfig
from gpuk8s.phases.verify import Verify
from gpuk8s.remote import Result
from tests.unit.fakekube import FakeKube
from tests.unit.test_gpuplan import facts_with
from tests.unit.test_localfiles import ADMIN

INV_TEXT = """
cluster: {name: ml, kubernetes_version: "1.30"}
hosts:
  - {name: cp-1, address: 10.0.0.10, role: control-plane}
  - {name: gpu-1, address: 10.0.0.21, labels: {team: vision}}
  - {name: gpu-2, address: 10.0.0.22, taints: ["nvidia.com/gpu=present:NoSchedule"]}
"""
INV = loads(INV_TEXT)
ADMIN_CONF = yaml.safe_dump(ADMIN, sort_keys=False)  # what kubeadm writes (tests/unit/test_localfiles.py)
FACTS = {"cp-1": facts_with(0), "gpu-1": facts_with(8), "gpu-2": facts_with(4)}


class ControlPlane:
    """A stand-in for the first control plane's SSH session: only `cat admin.conf` is read."""

    host = INV.host("cp-1")

    def run(self, command: str, **kw: object) -> Result:
        assert command.startswith(("cat /etc/kubernetes/admin.conf", "test -s")), command
        return Result(command, 0, ADMIN_CONF, "", 0.0)


def phases() -> list:
    return [Init(), Kubeconfig(), CNI("calico"), Join(), GPUNodes(), Verify()]


def ctx_for(kube: FakeKube, initialized: bool, tmp_path) -> Context:
    # the workers' connections: prepared (what join's plan and run take a host to join by)
    return Context(INV, sessions={"cp-1": ControlPlane(), **{h.name: object() for h in INV.workers}},  # type: ignore[dict-item]
                   facts=FACTS,
                   plans=gpuplan.plans(INV, FACTS), kube_client=kube, initialized_cache=initialized,
                   options=Options(kubeconfig_out=tmp_path / "ml.kubeconfig", test_pods=False))


def running_cluster(kube: FakeKube) -> None:
    """What a finished install leaves: every node with its labels and taints, CNI and GPU manifests."""
    plans = gpuplan.plans(INV, FACTS)
    for name, p in plans.items():
        kube.add_node(name, gpus=p.expected_gpus, labels=p.labels,
                      taints=[{"key": t.key, "value": t.value, "effect": t.effect} for t in p.taints])
    kube.apply(yaml.safe_dump({"apiVersion": "apps/v1", "kind": "DaemonSet",
                               "metadata": {"name": "calico-node", "namespace": "kube-system"}}))
    for m in manifests.wanted(INV, plans):
        kube.apply(m.applied_text())
    kube.calls.clear()


def test_a_fresh_cluster_plans_every_phase_and_writes_nothing(tmp_path) -> None:
    kube = FakeKube()
    plans = {p.name: p for p in plan_phases(phases(), ctx_for(kube, False, tmp_path))}
    assert {n: p.status for n, p in plans.items()} == {
        "init": "would-change", "kubeconfig": "would-change", "cni": "would-change", "join": "would-change",
        "gpu": "would-change", "verify": "unchanged"}
    init = plans["init"].changes[1]
    assert "kubeadm init --config /etc/kubernetes/gpuk8s-init-RANDOM.yaml" in init.commands
    assert "<token minted at run time>" in init.stdin and "kind: InitConfiguration" in init.stdin
    assert "sha256sum" in plans["cni"].changes[0].commands  # the manifest is checked before it is applied
    assert [c.what for c in plans["join"].changes] == ["a bootstrap token for this run", "kubeadm join gpu-1",
                                                       "kubeadm join gpu-2"]
    applied = [c.what.split()[1] for c in plans["gpu"].changes]
    assert applied == ["runtimeclass-nvidia.yaml", "nvidia-device-plugin-configs.yaml", "nvidia-device-plugin.yaml",
                       "nvidia-device-plugin-mps-control-daemon.yaml"]
    assert kube.writes == []
    assert not (tmp_path / "ml.kubeconfig").exists()


def test_a_running_cluster_as_the_inventory_describes_plans_nothing(tmp_path) -> None:
    kube = FakeKube()
    running_cluster(kube)
    (tmp_path / "ml.kubeconfig").write_text(ADMIN_CONF)
    plans = plan_phases(phases(), ctx_for(kube, True, tmp_path))
    assert {p.name: p.status for p in plans} == {n: "unchanged" for n in
                                                 ("init", "kubeconfig", "cni", "join", "gpu", "verify")}
    assert kube.writes == []


def test_a_node_missing_its_labels_is_the_only_change(tmp_path) -> None:
    kube = FakeKube()
    running_cluster(kube)
    kube.nodes["gpu-1"]["metadata"]["labels"] = {}
    ctx = ctx_for(kube, True, tmp_path)
    gpu = GPUNodes().plan(ctx)
    assert gpu.status == "would-change"
    assert [c.commands for c in gpu.changes] == [
        "kubectl label node gpu-1 nvidia.com/device-plugin.config=none nvidia.com/gpu.count=8 "
        "nvidia.com/gpu.memory=143771 nvidia.com/gpu.present=true nvidia.com/gpu.product=NVIDIA-H200 "
        "nvidia.com/gpu.replicas=1 nvidia.com/gpu.sharing-strategy=none team=vision --overwrite"]
    res = GPUNodes().run(ctx)
    assert res.status == "changed" and res.hosts == {"gpu-1": "labelled nvidia.com/device-plugin.config, "
                                                     "nvidia.com/gpu.count, nvidia.com/gpu.memory, "
                                                     "nvidia.com/gpu.present, nvidia.com/gpu.product, "
                                                     "nvidia.com/gpu.replicas, nvidia.com/gpu.sharing-strategy, team"}
    assert [c[0] for c in kube.writes] == ["label"]  # no manifest applied again
    assert GPUNodes().run(ctx).status == "unchanged"


def test_any_change_of_the_rendered_manifest_applies_it_again(monkeypatch, tmp_path) -> None:
    kube = FakeKube()
    running_cluster(kube)
    ctx = ctx_for(kube, True, tmp_path)
    assert GPUNodes().run(ctx).status == "unchanged"
    original = manifests.device_plugin_template()
    monkeypatch.setattr(manifests, "device_plugin_template", lambda: original + "\n")  # one byte more
    res = GPUNodes().run(ctx)
    assert res.status == "changed" and res.message == "applied nvidia-device-plugin.yaml"
    ds = kube.get("daemonset", "nvidia-device-plugin-daemonset", "kube-system")[0]
    assert ds["metadata"]["annotations"][manifests.ANNOTATION] == manifests.device_plugin(INV).sha256


@pytest.mark.parametrize("cpu_only", [True, False])
def test_the_gpu_manifests_exist_only_with_a_gpu_node(cpu_only: bool) -> None:
    inv = loads("hosts:\n  - {name: cp-1, address: 10.0.0.10, role: control-plane}\n"
                f"  - {{name: w-1, address: 10.0.0.11, gpus: {0 if cpu_only else 2}}}\n")
    names = [m.name for m in manifests.wanted(inv, gpuplan.plans(inv))]
    assert names == ([] if cpu_only else ["runtimeclass-nvidia.yaml", "nvidia-device-plugin-configs.yaml",
                                          "nvidia-device-plugin.yaml", "nvidia-device-plugin-mps-control-daemon.yaml"])


def test_the_applied_hash_is_the_sha256_of_the_rendered_text() -> None:
    m = manifests.device_plugin(INV)
    other = manifests.device_plugin(dataclasses.replace(
        INV, install=dataclasses.replace(INV.install, device_plugin_version="v0.0.1")))
    assert m.sha256 != other.sha256
    import hashlib

    assert m.sha256 == hashlib.sha256(m.text.encode()).hexdigest()
    for d in yaml.safe_load_all(m.applied_text()):
        assert d["metadata"]["annotations"][manifests.ANNOTATION] == m.sha256


def cluster_behind(monkeypatch: pytest.MonkeyPatch, kube: FakeKube) -> None:
    """flows' reads of the running cluster answered by `kube`, with no SSH session opened."""
    from gpuk8s import flows

    class NoSSH:
        def __init__(self, *a: object) -> None: ...
        def close(self) -> None: ...

    monkeypatch.setattr(flows, "Session", NoSSH)
    monkeypatch.setattr(Context, "initialized", lambda self: True)
    monkeypatch.setattr(Context, "kube", property(lambda self: kube))


def test_join_asking_a_cluster_whose_api_server_is_down_is_an_error_not_a_traceback(monkeypatch) -> None:
    from gpuk8s import flows
    from gpuk8s.kube.client import KubeError
    from gpuk8s.phases.base import PhaseError

    class Down(FakeKube):
        def get(self, kind, name=None, namespace=None):
            raise KubeError("kubectl get nodes (kubectl on cp-1) failed: The connection to the server was refused")

    cluster_behind(monkeypatch, Down())
    with pytest.raises(PhaseError, match="connection to the server was refused"):
        flows.not_joined(INV, {})


def _restarted(*hosts: str, status: str = "changed") -> Any:
    """A prepare report in which these hosts' container runtime was restarted (or would be)."""
    from types import SimpleNamespace as NS

    if status == "would-change":  # a dry run: the step that edits the config would change, the restart step
        # itself checks clean (its marker is written only by a real run)
        steps = [NS(step=NS(name="nvidia-runtime", restarts="containerd"), outcome=NS(status="would-change")),
                 NS(step=NS(name="containerd-restarted", restarts=""), outcome=NS(status="unchanged"))]
    else:
        steps = [NS(step=NS(name="nvidia-runtime", restarts="containerd"), outcome=NS(status=status)),
                 NS(step=NS(name="containerd-restarted", restarts=""), outcome=NS(status=status))]
    other = [NS(step=NS(name="kubelet-config", restarts="kubelet"), outcome=NS(status=status))]
    return NS(hosts=[NS(host=INV.host(h), steps=steps) for h in hosts] + [NS(host=INV.host("cp-1"), steps=other)])


def _plugin_pods(kube: FakeKube) -> None:
    for n in ("gpu-1", "gpu-2"):
        kube.apply(yaml.safe_dump({"apiVersion": "v1", "kind": "Pod", "metadata": {
            "name": f"nvidia-device-plugin-daemonset-{n}", "namespace": "kube-system",
            "ownerReferences": [{"kind": "DaemonSet", "name": "nvidia-device-plugin-daemonset"}]},
            "spec": {"nodeName": n}, "status": {"phase": "Running"}}))
    kube.calls.clear()


def test_a_plugin_is_restarted_where_prepare_restarted_the_runtime(tmp_path) -> None:
    # gpuk8s deploys the plugin with FAIL_ON_INIT_ERROR=false: one that started without NVML waits indefinitely,
    # so a runtime reconfigured under it (doctor --fix, an install re-run) is followed by a new plugin pod
    kube = FakeKube()
    running_cluster(kube)
    _plugin_pods(kube)
    ctx = ctx_for(kube, True, tmp_path)
    ctx.prepare_report = _restarted("gpu-2", status="would-change")
    plan = GPUNodes().plan(ctx)
    assert [(c.what, c.commands) for c in plan.changes] == [
        ("restart the device plugin on gpu-2 (its container runtime is reconfigured)",
         "kubectl -n kube-system delete pod nvidia-device-plugin-daemonset-gpu-2")]
    assert kube.writes == []
    ctx.prepare_report = _restarted("gpu-2")
    res = GPUNodes().run(ctx)
    assert res.status == "changed" and res.hosts == {"gpu-2": "device plugin restarted"}
    assert kube.writes == [("delete", "pod", "nvidia-device-plugin-daemonset-gpu-2")]
    assert ctx.relabelled == {"gpu-2"}  # verify waits for the new pod to register the GPUs
    assert ctx.plugin_restarted == {"gpu-2"}  # doctor --fix restarts no plugin twice (gpuk8s/doctor/fixes.py)
    # the plugin's manifest applied in the same run (a new template, or a first install): its DaemonSet replaces
    # the pods itself, none is deleted by gpuk8s
    kube.calls.clear()
    _plugin_pods(kube)
    kube.objects.pop(("daemonset", "kube-system", "nvidia-device-plugin-daemonset"))
    assert not [c for c in GPUNodes().plan(ctx).changes if c.what.startswith("restart")]
    res = GPUNodes().run(ctx)
    assert res.hosts == {} and not [w for w in kube.writes if w[0] == "delete"]
    assert [w[0] for w in kube.writes] == ["apply"]
    # nothing restarted by prepare (a re-run that changed nothing): no plugin touched
    kube.calls.clear()
    _plugin_pods(kube)
    ctx.prepare_report = _restarted()
    assert GPUNodes().run(ctx).status == "unchanged" and kube.writes == []
    # a runtime restarted on a node without a plugin pod yet (a first install): nothing to restart
    kube.objects.pop(("pod", "kube-system", "nvidia-device-plugin-daemonset-gpu-1"))
    ctx.prepare_report = _restarted("gpu-1", "cp-1")
    assert GPUNodes().run(ctx).status == "unchanged" and kube.writes == []


def test_restart_plugin_deletes_only_the_named_nodes_plugin_pods(tmp_path) -> None:
    from gpuk8s.phases.gpu import RestartPlugin

    kube = FakeKube()
    running_cluster(kube)
    _plugin_pods(kube)
    ctx = ctx_for(kube, True, tmp_path)
    assert [c.commands for c in RestartPlugin(["gpu-1", "cp-1"]).plan(ctx).changes] == [
        "kubectl -n kube-system delete pod nvidia-device-plugin-daemonset-gpu-1"]
    res = RestartPlugin(["gpu-1", "cp-1"]).run(ctx)
    assert res.status == "changed" and res.hosts == {"gpu-1": "device plugin restarted"}
    assert kube.writes == [("delete", "pod", "nvidia-device-plugin-daemonset-gpu-1")]
    assert RestartPlugin(["cp-1"]).run(ctx).status == "unchanged"


def test_the_plugin_restart_deletes_only_the_pods_of_gpuk8s_daemonset(tmp_path) -> None:
    # issue 28 item 9: doctor --fix and the gpu phase deleted any kube-system pod named nvidia-device-plugin* on
    # the node, while the diagnosis wanted gpuk8s's DaemonSet as owner; one check (state.is_device_plugin_pod) now
    from gpuk8s.phases.gpu import RestartPlugin

    kube = FakeKube()
    running_cluster(kube)
    for name, owners in (("nvidia-device-plugin-mine", []),  # a bare pod in kube-system
                         ("nvidia-device-plugin-helm-gpu-1",  # another tool's DaemonSet (the NVIDIA Helm chart's)
                          [{"kind": "DaemonSet", "name": "nvidia-device-plugin-helm"}]),
                         ("nvidia-device-plugin-daemonset-x",  # the right name, another kind of owner
                          [{"kind": "ReplicaSet", "name": "nvidia-device-plugin-daemonset"}])):
        kube.apply(yaml.safe_dump({"apiVersion": "v1", "kind": "Pod", "metadata": {
            "name": name, "namespace": "kube-system", "ownerReferences": owners},
            "spec": {"nodeName": "gpu-1"}, "status": {"phase": "Running"}}))
    kube.calls.clear()
    ctx = ctx_for(kube, True, tmp_path)
    assert RestartPlugin(["gpu-1"]).plan(ctx).changes == []
    assert RestartPlugin(["gpu-1"]).run(ctx).status == "unchanged" and kube.writes == []
    ctx.prepare_report = _restarted("gpu-1")  # the runtime reconfigured under it: still not gpuk8s's pod
    assert not [c for c in GPUNodes().plan(ctx).changes if c.what.startswith("restart")]
    GPUNodes().run(ctx)
    assert not [w for w in kube.writes if w[0] == "delete"]
    # gpuk8s's own pod beside them is the one restarted
    _plugin_pods(kube)
    ctx.prepare_report = None
    assert RestartPlugin(["gpu-1"]).run(ctx).status == "changed"
    assert kube.writes == [("delete", "pod", "nvidia-device-plugin-daemonset-gpu-1")]


def test_join_finishes_a_gpu_node_whose_join_stopped_before_the_gpu_phase(monkeypatch) -> None:
    """issue 41: a join killed after kubeadm join left a Node without nvidia.com/gpu.present; its re-run said
    "nothing to join" and the node never got its labels, plugin or proof. Such a node is named unfinished."""
    from gpuk8s import flows

    nodes = [{"metadata": {"name": "cp-1", "labels": {}}},
             {"metadata": {"name": "gpu-1", "labels": {"nvidia.com/gpu.present": "true"}}},
             {"metadata": {"name": "gpu-2", "labels": {"kubernetes.io/hostname": "gpu-2"}}}]

    class Nodes(FakeKube):
        def get(self, kind, name=None, namespace=None):
            return nodes

    cluster_behind(monkeypatch, Nodes())
    missing, unfinished = flows.not_joined(INV, {})
    assert missing == [] and [h.name for h in unfinished] == ["gpu-2"]
    nodes.pop()  # not a node at all: to join, not to finish
    missing, unfinished = flows.not_joined(INV, {})
    assert [h.name for h in missing] == ["gpu-2"] and unfinished == []


def test_kubeadm_inits_version_is_decided_once_for_the_plan_and_the_run(tmp_path) -> None:
    """init's --dry-run showed v1.30.0 for a minor alone while the run gave kubeadm init the installed kubeadm's
    patch (issue 45): the plan now shows what the run will use."""
    from gpuk8s.phases.init import init_version

    minor = INV
    assert init_version(minor, "v1.30.6") == "v1.30.6"  # the installed kubeadm of the minor, kept by prepare
    assert init_version(minor, "v1.29.9") is None and init_version(minor, None) is None  # prepare installs it
    doc = yaml.safe_load(INV_TEXT)
    doc["cluster"]["kubernetes_version"] = "1.30.4"
    pinned = loads(yaml.safe_dump(doc))
    assert init_version(pinned, "v1.30.6") == init_version(pinned, None) == "v1.30.4"  # prepare installs the pin

    def init_plan(facts: dict) -> str:
        ctx = ctx_for(FakeKube(), False, tmp_path)
        ctx.facts = facts
        change = plan_phases([Init()], ctx)[0].changes[1]
        return change.what + "\n" + change.stdin

    installed = dataclasses.replace(FACTS["cp-1"], kubeadm="v1.30.6")
    shown = init_plan({**FACTS, "cp-1": installed})
    assert "kubeadm init v1.30.6 on cp-1" in shown and "kubernetesVersion: v1.30.6" in shown
    assert "v1.30.0" not in shown
    shown = init_plan(FACTS)
    assert "kubeadm init v1.30.<the patch of the kubeadm prepare installs> on cp-1" in shown


def test_the_phase_names_docs_install_lists_are_installs_own_in_order() -> None:
    """docs/install.md's list of phase names (what --skip-phases takes) against install's phases (issue 45: the
    list had drifted: `health` was missing)."""
    import re
    from pathlib import Path

    from gpuk8s import flows
    from gpuk8s.phases.base import Options
    from gpuk8s.phases.bundle import Bundle

    text = (Path(__file__).resolve().parents[2] / "docs" / "install.md").read_text()
    sentence = re.search(r"names are the ones the phases print, in their order \((.*?)\)\.", text, re.S)
    assert sentence, "docs/install.md no longer lists the phase names"
    listed = re.findall(r"`([a-z][a-z-]*)`", sentence.group(1))
    doc = yaml.safe_load(INV_TEXT)
    doc["monitoring"] = {"enabled": True}
    every = flows.install_phases(loads(yaml.safe_dump(doc)))
    with_bundle = flows.with_bundle(every, Options(bundle=object()))  # type: ignore[arg-type]
    assert any(isinstance(p, Bundle) for p in with_bundle)
    assert listed == [p.name for p in with_bundle]


def test_the_phase_names_docs_list_for_upgrade_and_verify_are_their_own_in_order() -> None:
    """docs/install.md's and docs/upgrade.md's lists of upgrade's and verify's phase names against the code (issue 45:
    the docs' phase lists checked against the phases, not written twice by hand)."""
    import re
    from pathlib import Path

    from gpuk8s import flows
    from gpuk8s.phases import upgrade as up
    from gpuk8s.phases.base import Options
    from gpuk8s.phases.lock import Lock
    from gpuk8s.phases.verify import Verify

    docs = Path(__file__).resolve().parents[2] / "docs"
    install = (docs / "install.md").read_text()
    upgrade_doc = (docs / "upgrade.md").read_text()
    upgrade = [p.name for p in [*up.step_phases(up.UpgradeOptions("1.31")), Verify()]]
    for text, head in ((install, r"with its own phase\s+names \("), (upgrade_doc, r"\(the names: ")):
        m = re.search(head + r"(.*?)\)", text, re.S)
        assert m, head
        assert re.findall(r"`([a-z][a-z-]*)`", m.group(1)) == upgrade
    assert [p.name for p in flows.select_upgrade((), None).values()] == []  # nothing left out without a selection
    assert not isinstance(up.step_phases(up.UpgradeOptions("1.31"))[0], Lock)
    m = re.search(r"`gpuk8s verify` takes `--skip-phases` with its own \((.*?)\)", install, re.S)
    assert m
    doc = yaml.safe_load(INV_TEXT)
    doc["monitoring"] = {"enabled": True}
    every = flows.select_verify(loads(yaml.safe_dump(doc)), Options(fabric=True))
    assert re.findall(r"`([a-z][a-z-]*)`", m.group(1)) == [p.name for p in every]


def test_verify_leaves_out_the_phases_named_and_refuses_a_name_it_does_not_have() -> None:
    from gpuk8s import flows
    from gpuk8s.phases.base import Options, PhaseSelectionError, Skipped

    doc = yaml.safe_load(INV_TEXT)
    doc["monitoring"] = {"enabled": True}
    inv = loads(yaml.safe_dump(doc))
    got = flows.select_verify(inv, Options(fabric=True), ["monitoring-verify"])
    assert [(p.name, isinstance(p, Skipped)) for p in got] == [("verify", False), ("monitoring-verify", True),
                                                               ("fabric", False)]
    assert [p.name for p in flows.select_verify(loads(INV_TEXT), Options())] == ["verify"]
    # fabric is verify's even without --fabric: skipping it is no mistake
    assert [p.name for p in flows.select_verify(loads(INV_TEXT), Options(), ["fabric"])] == ["verify"]
    with pytest.raises(PhaseSelectionError, match="verify has no phase gpu"):
        flows.select_verify(inv, Options(), ["gpu"])


def test_join_plans_only_the_hosts_its_run_joins(tmp_path) -> None:
    """Issue 45: join's plan listed a host preflight had blocked (its connection closed), which its run skips; both
    now come from Join.decide."""
    from gpuk8s.phases.join import Join

    kube = FakeKube()
    kube.add_node("cp-1")
    ctx = ctx_for(kube, True, tmp_path)
    blocked = INV.workers[0].name
    ctx.sessions.pop(blocked)
    planned = Join().plan(ctx)
    joins = [c.host for c in planned.changes if c.what.startswith("kubeadm join")]
    assert blocked not in joins and joins == [h.name for h in INV.workers if h.name != blocked]
    assert f"{blocked} not joined: not prepared" in planned.reason
    assert [h.name for h in Join.decide(ctx).todo] == joins
