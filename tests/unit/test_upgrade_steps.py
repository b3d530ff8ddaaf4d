"""The upgrade's pure rules (gpuk8s/phases/upgrade.py): one minor at a time through the matrix, downgrades and
gaps refused with the reason, the new minor's pins only where the inventory kept the defaults."""

from __future__ import annotations

import dataclasses

import pytest
import yaml

from gpuk8s import versions
from gpuk8s.inventory.loader import loads
from gpuk8s.phases.nodeops import gpu_pods
from gpuk8s.phases.upgrade import UpgradeRefused, minor, steps, target_inventory

MINORS = ["1.29", "1.30", "1.31", "1.33"]


def test_minor() -> None:
    assert minor("v1.30.14") == 30 and minor("1.31") == 31 and minor("1.9.2") == 9
    assert minor("") is None and minor("2.0") is None


def test_steps_one_minor_at_a_time() -> None:
    assert steps(29, None, MINORS) == ["1.30"]
    assert steps(29, "1.31", MINORS) == ["1.30", "1.31"]
    assert steps(31, "1.31", MINORS) == []


def test_steps_refused_with_the_reason() -> None:
    with pytest.raises(UpgradeRefused, match="1.32 is not in gpuk8s's version matrix: kubeadm upgrades one minor"):
        steps(31, "1.33", MINORS)
    with pytest.raises(UpgradeRefused) as e:
        steps(30, "1.33", MINORS)
    assert "upgrade to 1.31 at most" in e.value.remedy
    with pytest.raises(UpgradeRefused, match="downgrade"):
        steps(31, "1.30", MINORS)
    with pytest.raises(UpgradeRefused, match="not a Kubernetes minor"):
        steps(30, "1.31.2", MINORS)
    with pytest.raises(UpgradeRefused, match="not in gpuk8s's version matrix"):
        steps(33, None, MINORS)  # no newer minor known


def test_target_inventory_moves_default_pins_only() -> None:
    inv = loads('cluster: {kubernetes_version: "1.30"}\n'
                'hosts: [{name: cp-1, address: 10.0.0.1, role: control-plane}]\n')
    t = target_inventory(inv, "1.36")
    assert t.cluster.kubernetes_version == "1.36"
    assert t.install.device_plugin_version == versions.install_defaults("1.36")["device_plugin_version"]
    pinned = dataclasses.replace(inv, install=dataclasses.replace(inv.install, device_plugin_version="v0.14.0"))
    assert target_inventory(pinned, "1.36").install.device_plugin_version == "v0.14.0"


class _Kube:
    def __init__(self, pods: list[dict]) -> None:
        self.pods = pods

    def get(self, kind: str, name: str | None = None, namespace: str | None = None) -> list[dict]:
        return self.pods


def test_gpu_pods_named_running_only_not_daemonsets() -> None:
    def pod(name: str, node: str, phase: str, gpus: int, owner: str = "Job") -> dict:
        return {"metadata": {"name": name, "namespace": "ml", "ownerReferences": [{"kind": owner}]},
                "spec": {"nodeName": node, "containers": [{"resources": {"limits": {"nvidia.com/gpu": gpus}}}]},
                "status": {"phase": phase}}

    kube = _Kube([
        pod("train", "gpu-1", "Running", 2), pod("done", "gpu-1", "Succeeded", 1), pod("cpu", "gpu-1", "Running", 0),
        pod("plugin", "gpu-1", "Running", 1, owner="DaemonSet"), pod("other", "gpu-2", "Running", 1)])
    assert gpu_pods(kube, "gpu-1") == ["ml/train"]  # type: ignore[arg-type]


class _CordonKube(_Kube):
    def __init__(self, pods: list[dict]) -> None:
        super().__init__(pods)
        self.calls: list[tuple[str, str]] = []

    def cordon(self, node: str) -> None:
        self.calls.append(("cordon", node))

    def uncordon(self, node: str) -> None:
        self.calls.append(("uncordon", node))

    def label(self, node: str, labels: dict) -> None:
        self.calls.append(("label", node))


def _job(node: str) -> dict:
    return {"metadata": {"name": "train", "namespace": "ml", "ownerReferences": [{"kind": "Job"}]},
            "spec": {"nodeName": node, "containers": [{"resources": {"limits": {"nvidia.com/gpu": 1}}}]},
            "status": {"phase": "Running"}}


def test_gpu_pods_waited_for_then_timeout_leaves_the_node_uncordoned(monkeypatch: pytest.MonkeyPatch) -> None:
    from gpuk8s.phases import nodeops
    from gpuk8s.phases.nodeops import NodeFailure
    from gpuk8s.phases.upgrade import UpgradeOptions

    kube = _CordonKube([_job("gpu-1")])
    opts = UpgradeOptions("1.31", gpu_pod_timeout=0.05, poll=0.01)
    lines: list[str] = []
    with pytest.raises(NodeFailure) as e:
        nodeops.wait_gpu_pods(kube, "gpu-1", opts, lines.append, "gpuk8s upgrade")  # type: ignore[arg-type]
    assert e.value.id == "upgrade.gpu-pods-timeout" and "ml/train" in e.value.message
    assert kube.calls == [("cordon", "gpu-1"), ("uncordon", "gpu-1"), ("label", "gpu-1")]
    assert any("waiting up to" in ln and "ml/train" in ln for ln in lines)
    # the pod finishes: waited for, named, the node stays cordoned for its drain
    kube.pods = [_job("gpu-1")]
    opts.gpu_pod_timeout = 5

    def finish(_s: float) -> None:
        kube.pods[0]["status"]["phase"] = "Succeeded"

    import gpuk8s.phases.poll as poll

    monkeypatch.setattr(poll.time, "sleep", finish)
    got = nodeops.wait_gpu_pods(kube, "gpu-1", opts, lines.append, "gpuk8s upgrade")  # type: ignore[arg-type]
    assert got == ["ml/train"] and kube.calls[-1] == ("cordon", "gpu-1")


def test_each_command_takes_only_its_own_cordon() -> None:
    """A node cordoned by a stopped run of another gpuk8s command (its mark) is that command's to finish: gpuk8s
    upgrade's cordon (mark "true") took any mark as its own, so an upgrade uncordoned a node a stopped driver upgrade
    had left cordoned before its GPUs were back."""
    from gpuk8s.phases import nodeops
    from tests.unit.fakekube import FakeKube

    kube = FakeKube()
    kube.add_node("gpu-1", gpus=1, labels={nodeops.CORDONED_BY: "driver-upgrade"})
    kube.nodes["gpu-1"]["spec"]["unschedulable"] = True
    assert not nodeops.take_cordon(kube, "gpu-1", "true")
    assert nodeops.take_cordon(kube, "gpu-1", "driver-upgrade")
    assert nodeops.marked(kube, "driver-upgrade") == {"gpu-1"} and nodeops.marked(kube, "true") == set()
    kube.add_node("gpu-2", gpus=1)
    assert nodeops.take_cordon(kube, "gpu-2", "allocator")
    assert kube.nodes["gpu-2"]["metadata"]["labels"][nodeops.CORDONED_BY] == "allocator"
    # another command's mark on a schedulable node (its run stopped before its cordon, or between its uncordon and
    # the mark's removal): nothing holds the node, so this command's cordon is its own to undo (else the node stayed
    # cordoned after the work, "as it was before", which it was not)
    assert nodeops.take_cordon(kube, "gpu-2", "true")
    assert kube.nodes["gpu-2"]["metadata"]["labels"][nodeops.CORDONED_BY] == "true"


def test_one_node_at_a_time_runs_in_the_callers_thread() -> None:
    """Ctrl-C must stop a node's work where it is: one at a time, the executor runs it in the calling thread (a worker
    thread went on draining and relabelling after the run had released the cluster lock)."""
    import threading

    from gpuk8s.inventory.model import Host, SSHSettings
    from gpuk8s.phases import nodeops

    seen: list[object] = []

    def work(h: Host) -> nodeops.NodeOutcome:
        seen.append(threading.current_thread())
        if h.name == "b":
            raise KeyError("a defect")
        return nodeops.NodeOutcome("done", "ok")

    hosts = [Host(n, "10.0.0.2", "worker", SSHSettings()) for n in ("a", "b", "c")]
    opts = nodeops.NodeOptions()
    got = nodeops.each_node(hosts, work, opts, "upgrade.node-failed", "gpuk8s upgrade")
    assert seen == [threading.current_thread()] * 3
    assert [o.status for o in got.values()] == ["done", "failed", "done"] and "KeyError" in got["b"].detail
    assert [f.id for f in opts.findings] == ["upgrade.node-failed"]


# -- playbooks/cluster/upgrade-packages.sh, run for real with apt-get/apt-mark/dpkg-query/systemctl stubs --

def _stub_host(tmp_path, installed: dict[str, str]) -> tuple[dict[str, str], object]:
    """A PATH of stubs that log their argv to tmp_path/log; dpkg-query answers from `installed`."""
    import os
    import stat

    bin_ = tmp_path / "bin"
    bin_.mkdir()
    (tmp_path / "versions").mkdir()
    for p, v in installed.items():
        (tmp_path / "versions" / p).write_text(v)
    log = tmp_path / "log"
    stubs = {
        "dpkg-query": f'echo "dpkg-query $*" >> {log}; for a; do p=$a; done; '
                      f'[ -e {tmp_path}/versions/"$p" ] || exit 1; cat {tmp_path}/versions/"$p"',
        # apt-get install P=1.31.*: the package moves to 1.31.2-1.1 (dpkg-query sees it)
        "apt-get": f'echo "apt-get $*" >> {log}; for a; do case "$a" in *=*) '
                   f'p=${{a%%=*}}; echo 1.31.2-1.1 > {tmp_path}/versions/"$p" ;; esac; done',
        # apt-mark refuses a name that is no package, as apt-mark does (exit 100)
        "apt-mark": f'echo "apt-mark $*" >> {log}; for a; do case "$a" in hold) ;; '
                    f'*) [ -e {tmp_path}/versions/"$a" ] || {{ echo "E: Unable to locate package $a" >&2; '
                    'exit 100; } ;; esac; done',
        "systemctl": f'echo "systemctl $*" >> {log}',
    }
    for name, body in stubs.items():
        f = bin_ / name
        f.write_text("#!/bin/sh\n" + body + "\n")
        f.chmod(f.stat().st_mode | stat.S_IXUSR)
    env = {"PATH": f"{bin_}:/usr/bin:/bin", "HOME": str(tmp_path)}
    assert "rpm" not in os.listdir(bin_)
    return env, log


def _run_packages(env: dict[str, str], packages: list[str], restart: str, family: str = "") -> str:
    import subprocess

    from gpuk8s.phases import shell

    text = shell.command("upgrade-packages", minor="1.31", packages=packages, restart=restart, lock_timeout=60,
                         family=family)
    p = subprocess.run(["sh", "-c", text], capture_output=True, text=True, env=env)
    assert p.returncode == 0, p.stdout + p.stderr
    return p.stdout


def test_upgrade_packages_installs_and_holds_each_package(tmp_path) -> None:
    env, log = _stub_host(tmp_path, {"kubelet": "1.30.14-1.1", "kubectl": "1.30.14-1.1"})
    out = _run_packages(env, ["kubelet", "kubectl"], "yes")
    assert "@@gpuk8s-upgraded kubelet kubectl" in out and "@@gpuk8s-packages-done" in out
    lines = log.read_text().splitlines()  # type: ignore[attr-defined]
    assert "apt-mark hold kubelet kubectl" in lines
    assert any(ln.startswith("apt-get") and "kubelet=1.31.*" in ln and "kubectl=1.31.*" in ln for ln in lines)
    assert "systemctl restart kubelet" in lines


def test_upgrade_packages_restarts_an_old_kubelet_on_resume(tmp_path) -> None:
    # an earlier run installed 1.31 and was stopped before the restart: the packages are at the minor, yet the
    # drained node's kubelet must restart onto the new binary
    env, log = _stub_host(tmp_path, {"kubelet": "1.31.2-1.1", "kubectl": "1.31.2-1.1"})
    out = _run_packages(env, ["kubelet", "kubectl"], "yes")
    assert "@@gpuk8s-upgraded" not in out and "@@gpuk8s-packages-done" in out
    lines = log.read_text().splitlines()  # type: ignore[attr-defined]
    assert "systemctl restart kubelet" in lines and not any(ln.startswith("apt-get") for ln in lines)
    # kubeadm only (restart=no): nothing restarts
    (tmp_path / "k").mkdir()
    env2, log2 = _stub_host(tmp_path / "k", {"kubeadm": "1.31.2-1.1"})
    _run_packages(env2, ["kubeadm"], "no")
    assert not any("systemctl" in ln for ln in log2.read_text().splitlines())  # type: ignore[attr-defined]


def test_upgrade_packages_takes_the_package_manager_from_the_os_family(tmp_path) -> None:
    """issue 41: an Alibaba Cloud Linux host with an apt-get on its PATH (the lab's hosts have one, whatever their
    OS) got apt-get; the family of the host's facts decides now, the PATH only where there are no facts."""
    import stat

    env, log = _stub_host(tmp_path, {"kubeadm": "1.30.14"})
    for name, body in {"rpm": f'echo "rpm $*" >> {log}; for a; do p=$a; done; cat {tmp_path}/versions/"$p"',
                       "dnf": f'echo "dnf $*" >> {log}'}.items():
        f = tmp_path / "bin" / name
        f.write_text("#!/bin/sh\n" + body + "\n")
        f.chmod(f.stat().st_mode | stat.S_IXUSR)
    assert "@@gpuk8s-upgraded kubeadm" in _run_packages(env, ["kubeadm"], "no", family="rhel")
    lines = log.read_text().splitlines()
    assert "dnf install -y -q --disableexcludes=kubernetes kubeadm-1.31.*" in lines
    assert not any(ln.startswith(("apt-get", "apt-mark", "dpkg-query")) for ln in lines), lines
    log.write_text("")
    _run_packages(env, ["kubeadm"], "no")  # no facts: the PATH's apt-get
    assert any(ln.startswith("apt-get") for ln in log.read_text().splitlines())


def test_upgrade_packages_refuses_unknown_names() -> None:
    from gpuk8s.phases.upgrade import _package_list

    assert _package_list("kubelet kubectl") == ["kubelet", "kubectl"]
    with pytest.raises(ValueError):
        _package_list("kubelet; rm -rf /")


# -- GPU pods of every namespace; cordons: only what the upgrade cordoned is uncordoned --

def test_gpu_pods_of_every_namespace_not_only_default() -> None:
    from tests.unit.fakekube import FakeKube

    kube = FakeKube()
    kube.add_node("gpu-1", gpus=1)
    kube.apply(yaml.safe_dump({"kind": "Pod", **_job("gpu-1")}))  # a training Job's pod in namespace ml
    assert gpu_pods(kube, "gpu-1") == ["ml/train"]


def _worker_ctx(monkeypatch: pytest.MonkeyPatch, kube, kubelet: str = "v1.30.14"):
    """A one-worker Context on the fake API; the host commands (packages, kubeadm) recorded, not run."""
    import gpuk8s.phases.upgrade as up
    from gpuk8s.phases.base import Context

    inv = loads('cluster: {kubernetes_version: "1.30"}\n'
                'hosts: [{name: cp-1, address: 10.0.0.1, role: control-plane}, {name: gpu-1, address: 10.0.0.2}]\n')
    for n in ("cp-1", "gpu-1"):
        if n not in kube.nodes:
            kube.add_node(n)
        kube.nodes[n]["status"]["nodeInfo"] = {"kubeletVersion": kubelet}
    ran: list[str] = []
    monkeypatch.setattr(up, "_packages", lambda ctx, h, to, packages, restart: ran.append(packages) or True)
    monkeypatch.setattr(up, "_kubeadm", lambda ctx, h, action, version="": ran.append(action) or "")
    monkeypatch.setattr(up, "apiserver_version", lambda s: "v1.31.2")
    ctx = Context(inv, kube_client=kube)
    ctx.sessions["gpu-1"] = object()  # type: ignore[assignment]
    ctx.sessions["cp-1"] = object()  # type: ignore[assignment]
    return ctx, ran


def test_upgrade_leaves_an_operator_cordon_in_place(monkeypatch: pytest.MonkeyPatch) -> None:
    from gpuk8s.phases.upgrade import UpgradeOptions, UpgradeWorkers
    from tests.unit.fakekube import FakeKube

    kube = FakeKube()
    kube.add_node("gpu-1", gpus=1)
    kube.cordon("gpu-1")  # the operator's maintenance cordon
    ctx, ran = _worker_ctx(monkeypatch, kube)
    h = ctx.inv.hosts[1]
    UpgradeWorkers(UpgradeOptions("1.31"))._upgrade_node(ctx, h, False, lambda s: None)
    assert ran == ["kubeadm", "node", "kubelet kubectl"]
    assert ("drain", "gpu-1", "600") in kube.calls
    assert kube.nodes["gpu-1"]["spec"].get("unschedulable") is True  # still cordoned: not gpuk8s's cordon


def test_upgrade_uncordons_a_node_it_cordoned_when_found_done_on_resume(monkeypatch: pytest.MonkeyPatch) -> None:
    from gpuk8s.phases.upgrade import UpgradeOptions, UpgradeWorkers
    from tests.unit.fakekube import FakeKube

    kube = FakeKube()
    kube.add_node("gpu-1", gpus=1)
    ctx, ran = _worker_ctx(monkeypatch, kube)
    h = ctx.inv.hosts[1]

    # the run stops after the kubelet's restart, before the uncordon
    def stop(node: str) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(kube, "uncordon", stop)
    with pytest.raises(KeyboardInterrupt):
        UpgradeWorkers(UpgradeOptions("1.31"))._upgrade_node(ctx, h, False, lambda s: None)
    assert kube.nodes["gpu-1"]["spec"].get("unschedulable") is True
    monkeypatch.undo()
    # the next run finds gpu-1 at 1.31 (its kubelet reports it) and puts it back as it was: schedulable
    ctx, ran = _worker_ctx(monkeypatch, kube, kubelet="v1.31.2")
    r = UpgradeWorkers(UpgradeOptions("1.31")).run(ctx)
    assert r.status == "changed" and "uncordoned" in r.hosts["gpu-1"], r.hosts
    assert not kube.nodes["gpu-1"]["spec"].get("unschedulable") and ran == []
    # an operator's cordon on a node found done stays
    kube.cordon("gpu-1")
    r = UpgradeWorkers(UpgradeOptions("1.31")).run(ctx)
    assert kube.nodes["gpu-1"]["spec"].get("unschedulable") is True and r.status == "unchanged"


def test_drain_over_ssh_gets_the_drain_timeout_not_the_ssh_command_timeout() -> None:
    """kubectl drain --timeout=N must not be cut off by ssh.command_timeout (600 s) first."""
    from gpuk8s.kube.client import SSHKubectl
    from gpuk8s.remote import Result

    class Session:
        host = dataclasses.make_dataclass("H", [("name", str)])("cp-1")

        def __init__(self) -> None:
            self.timeouts: list[float | None] = []

        def run(self, command: str, *, sudo: bool = False, timeout: float | None = None, **kw: object) -> Result:
            self.timeouts.append(timeout)
            return Result(command, 0, "node/gpu-1 drained\n", "", 0.1)

    s = Session()
    SSHKubectl(s).drain("gpu-1", 1800)  # type: ignore[arg-type]
    assert s.timeouts == [1860]
