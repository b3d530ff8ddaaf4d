"""gpuk8s reset without hosts: the safe order, the refusals (last control plane, etcd quorum), the plan
(--dry-run writes nothing) and the run against a fake API and fake SSH sessions, and the rendered scripts
(every value quoted)."""

from __future__ import annotations

import shlex

import pytest
from typer.testing import CliRunner

from gpuk8s.inventory.loader import loads
from gpuk8s.phases import shell
from gpuk8s.phases.base import Context, plan_phases, run_phases
from gpuk8s.phases.reset import Reset, node_script, order, purge_script, refusal
from gpuk8s.remote import Result
from tests.unit.fakekube import FakeKube

INV = loads("""
cluster: {name: ml, kubernetes_version: "1.30"}
ssh: {user: ops}
hosts:
  - {name: cp-1, address: 10.0.0.10, role: control-plane}
  - {name: cp-2, address: 10.0.0.11, role: control-plane}
  - {name: cp-3, address: 10.0.0.12, role: control-plane}
  - {name: gpu-1, address: 10.0.0.21}
  - {name: gpu-2, address: 10.0.0.22}
""")


def hosts(*names: str):
    return [INV.host(n) for n in names]


def test_order_is_workers_then_other_control_planes_then_the_first():
    assert [h.name for h in order(INV, INV.hosts)] == ["gpu-1", "gpu-2", "cp-3", "cp-2", "cp-1"]
    assert [h.name for h in order(INV, hosts("cp-2", "gpu-2"))] == ["gpu-2", "cp-2"]


@pytest.mark.parametrize("names, members, want", [
    (("gpu-1",), ("cp-1",), None),
    (("cp-3",), ("cp-1", "cp-2", "cp-3"), None),  # 2 of 3 stay: quorum 2 holds
    (("cp-2", "cp-3"), ("cp-1", "cp-2", "cp-3"), "reset.etcd-quorum"),
    (("cp-2",), ("cp-1", "cp-2"), "reset.etcd-quorum"),  # 1 of 2: an etcd of 2 tolerates no failure
    (("cp-1",), ("cp-1",), "reset.last-control-plane"),
    (("cp-1", "gpu-1"), ("cp-1", "cp-2", "cp-3"), "reset.first-control-plane"),
    (("cp-3",), ("cp-1", "cp-2"), None),  # not a member (never joined): no etcd change
])
def test_refusals(names, members, want):
    got = refusal(INV, hosts(*names), False, members)
    assert (got.id if got else None) == want
    if got:
        assert got.message and got.remedy


def test_all_is_never_refused():
    assert refusal(INV, INV.hosts, True, ["cp-1", "cp-2"]) is None


class FakeHost:
    """A host's SSH session: records the scripts it runs, answers as the reset scripts do."""

    def __init__(self, name: str, fail: bool = False) -> None:
        self.host = INV.host(name)
        self.ran: list[str] = []
        self.fail = fail

    def run(self, command: str, **kw: object) -> Result:
        self.ran.append(command)
        if command.startswith("test -s"):
            return Result(command, 0, "", "", 0.0)
        if self.fail:
            return Result(command, 1, "", "kubeadm: boom", 0.0)
        if "@@gpuk8s-purge-done" in command:
            return Result(command, 0, "restored /etc/containerd/config.toml\n@@gpuk8s-purge-done\n", "", 0.0)
        return Result(command, 0, "@@gpuk8s-reset-done\n", "", 0.0)


def cluster(*names: str) -> FakeKube:
    kube = FakeKube()
    for n in names:
        kube.add_node(n)
    return kube


def ctx_for(kube: FakeKube, sessions: dict) -> Context:
    return Context(INV, sessions=sessions, kube_client=kube, initialized_cache=True)  # type: ignore[arg-type]


def test_plan_shows_the_exact_commands_and_writes_nothing():
    kube = cluster("cp-1", "cp-2", "cp-3", "gpu-1", "gpu-2")
    ctx = ctx_for(kube, {"cp-1": FakeHost("cp-1"), "gpu-1": FakeHost("gpu-1")})
    [plan] = plan_phases([Reset(hosts("gpu-1"), purge=True, drain_timeout=42, all_hosts=False)], ctx)
    assert plan.status == "would-change"
    whats = [c.what for c in plan.changes]
    assert whats[0].startswith("drain gpu-1") and "delete the Node object gpu-1" in whats
    drain = plan.changes[0].commands
    assert "drain gpu-1 --ignore-daemonsets --delete-emptydir-data --timeout=42s" in drain
    assert "kubeadm reset -f" in plan.changes[1].commands
    assert "purge gpu-1" in whats[-1] and "/var/lib/gpuk8s/backup" in plan.changes[-1].commands
    assert kube.writes == [] and ctx.sessions["gpu-1"].ran == []


def test_run_drains_resets_then_deletes_each_node_in_order():
    kube = cluster("cp-1", "cp-2", "cp-3", "gpu-1", "gpu-2")
    sess = {n: FakeHost(n) for n in ("cp-1", "cp-3", "gpu-2")}
    phase = Reset(order(INV, hosts("cp-3", "gpu-2")), purge=False, drain_timeout=30, all_hosts=False)
    results: list = []
    assert run_phases([phase], ctx_for(kube, sess), results)
    assert results[0].status == "changed"
    assert [c for c in kube.calls if c[0] != "get"] == [
        ("drain", "gpu-2", "30"), ("delete", "node", "gpu-2"), ("drain", "cp-3", "30"), ("delete", "node", "cp-3")]
    assert set(kube.nodes) == {"cp-1", "cp-2", "gpu-1"}
    assert [o.status for o in phase.outcomes] == ["reset", "reset"]
    assert "etcd member" in phase.outcomes[1].message
    assert any("kubeadm reset -f" in c for c in sess["gpu-2"].ran)


def test_a_blocked_drain_stops_there_and_leaves_the_node_cordoned():
    kube = cluster("cp-1", "gpu-1", "gpu-2")
    kube.drain_error = ('error when evicting pods/"web-1" -n "default" (will retry after 5s): Cannot evict pod as '
                        "it would violate the pod's disruption budget.")
    sess = {n: FakeHost(n) for n in ("cp-1", "gpu-1", "gpu-2")}
    phase = Reset(order(INV, hosts("gpu-1", "gpu-2")), purge=False, drain_timeout=5, all_hosts=False)
    results: list = []
    assert not run_phases([phase], ctx_for(kube, sess), results)
    assert [(o.name, o.status, o.id) for o in phase.outcomes] == [
        ("gpu-1", "failed", "reset.drain-blocked"), ("gpu-2", "skipped", "reset.skipped")]
    assert "uncordon gpu-1" in phase.outcomes[0].remedy
    assert kube.nodes["gpu-1"]["spec"]["unschedulable"] is True and "gpu-1" in kube.nodes
    assert not any("kubeadm" in c for c in sess["gpu-1"].ran)


def test_an_unreachable_host_leaves_the_cluster_but_is_reported():
    kube = cluster("cp-1", "gpu-1")
    phase = Reset(hosts("gpu-1"), purge=False, drain_timeout=5, all_hosts=False)
    results: list = []
    run_phases([phase], ctx_for(kube, {"cp-1": FakeHost("cp-1")}), results)
    assert phase.outcomes[0].id == "reset.host-unreachable" and "gpu-1" not in kube.nodes


def test_all_resets_the_first_control_plane_last_without_asking_the_api_after():
    kube = cluster("cp-1", "gpu-1")
    sess = {n: FakeHost(n) for n in ("cp-1", "gpu-1")}
    inv_hosts = [INV.host("gpu-1"), INV.host("cp-1")]
    phase = Reset(inv_hosts, purge=False, drain_timeout=5, all_hosts=True)
    results: list = []
    assert run_phases([phase], ctx_for(kube, sess), results)
    assert [c for c in kube.calls if c[0] != "get"] == [("drain", "gpu-1", "5"), ("delete", "node", "gpu-1")]
    assert any("kubeadm reset -f" in c for c in sess["cp-1"].ran)


def test_scripts_quote_every_value():
    hostile = loads("""
cluster: {name: ml, control_plane_endpoint: "api.example.com:6443"}
ssh: {user: ops}
hosts:
  - {name: cp-1, address: 10.0.0.10, role: control-plane}
""")
    text = node_script(hostile, hostile.host("cp-1"))
    assert "getent passwd ops" in text
    assert shlex.quote("server: https://api.example.com:6443") in text
    assert "kubeadm reset -f --cri-socket unix:///var/run/containerd/containerd.sock" in text
    assert "rm -f /etc/cni/net.d/10-calico.conflist" in text
    assert "apt-get -q -y -o DPkg::Lock::Timeout=120 purge" in purge_script(hostile)
    # the rendered scripts are valid shell
    import subprocess

    for t in ("reset-node", "reset-purge"):
        src = shell.script(t, user="o'ps; rm -rf /", endpoint="x", lock_timeout=5,
                           cri_socket="unix:///var/run/cri-dockerd.sock", control_plane="yes; rm -rf /")
        assert "control_plane='yes; rm -rf /'" in src or t == "reset-purge"
        assert "'o'\"'\"'ps; rm -rf /'" in src or t == "reset-purge"
        assert subprocess.run(["bash", "-n"], input=src, text=True).returncode == 0


@pytest.fixture
def cli_app():
    """The app with the host commands registered (main() does it; once per process)."""
    from gpuk8s import cli

    if not any(c.callback is not None and c.callback.__name__ == "reset" for c in cli.app.registered_commands):
        cli._register_commands()
    return cli.app


def test_cli_needs_hosts_or_all_and_yes_when_not_interactive(tmp_path, monkeypatch, cli_app):
    app = cli_app
    inv = tmp_path / "inv.yaml"
    inv.write_text("hosts:\n  - {name: cp-1, address: 10.0.0.10, role: control-plane}\n"
                   "  - {name: gpu-1, address: 10.0.0.21}\n")
    r = CliRunner().invoke(app, ["reset", "-i", str(inv)])
    assert r.exit_code == 2 and "--all" in r.output
    r = CliRunner().invoke(app, ["reset", "gpu-1", "--all", "-i", str(inv)])
    assert r.exit_code == 2
    r = CliRunner().invoke(app, ["reset", "nope", "-i", str(inv)])
    assert r.exit_code == 2 and "not in the inventory: nope" in r.output
    from gpuk8s.commands import reset as cmd

    monkeypatch.setattr(cmd.flows, "cluster_nodes", lambda inv, sudo: {"cp-1": True, "gpu-1": True})
    called = []
    monkeypatch.setattr(cmd.flows, "reset", lambda *a, **k: called.append(a))
    r = CliRunner().invoke(app, ["reset", "gpu-1", "-i", str(inv)])
    assert r.exit_code == 2 and "--yes" in r.output and called == []
    r = CliRunner().invoke(app, ["reset", "cp-1", "-i", str(inv), "--yes", "-o", "json"])
    assert r.exit_code == 2 and '"reset.last-control-plane"' in r.output and called == []


# -- review fixes: etcd member kept, unreachable control planes, quorum of Ready control planes --

KUBEADM_ETCD_WARNING = (  # kubeadm's removeetcdmember.go klog.Warningf, as kubeadm 1.29+ prints it
    "W1130 10:00:00.000000    1234 removeetcdmember.go:61] [reset] Failed to remove etcd member: etcdserver: "
    "re-configuration failed due to not enough started members, please manually remove this etcd member using "
    "etcdctl\n@@gpuk8s-etcd-member-kept\n")


class EtcdKeptHost(FakeHost):
    def run(self, command: str, **kw: object) -> Result:
        if "kubeadm reset -f" in command:
            self.ran.append(command)
            return Result(command, 0, KUBEADM_ETCD_WARNING, "", 0.0)
        return super().run(command, **kw)


def test_a_control_plane_whose_etcd_member_stays_is_not_reported_reset_and_its_node_stays():
    kube = cluster("cp-1", "cp-2", "cp-3", "gpu-1")
    sess = {"cp-1": FakeHost("cp-1"), "cp-3": EtcdKeptHost("cp-3")}
    phase = Reset(hosts("cp-3"), purge=False, drain_timeout=5, all_hosts=False)
    results: list = []
    assert not run_phases([phase], ctx_for(kube, sess), results)
    [out] = phase.outcomes
    assert out.status == "failed" and out.id == "reset.etcd-member-kept", out
    assert "etcdctl" in out.remedy and "/var/lib/gpuk8s/etcd-member-kept" in out.remedy
    assert "cp-3" in kube.nodes and ("delete", "node", "cp-3") not in kube.calls


def test_the_node_script_keeps_etcd_data_on_failure_and_only_on_control_planes():
    cp = node_script(INV, INV.host("cp-2"))
    worker = node_script(INV, INV.host("gpu-1"))
    assert "failed to remove etcd member" in cp and "@@gpuk8s-etcd-member-kept" in cp
    for text in (cp, worker):
        assert "rm -rf /var/lib/etcd" not in text and "rm -rf /etc/cni/net.d" not in text
        assert "--one-file-system" in text
    assert "control_plane=yes" in cp and "control_plane=no" in worker


def test_an_unreachable_control_plane_keeps_its_node_and_is_not_drained():
    kube = cluster("cp-1", "cp-2", "cp-3")
    phase = Reset(hosts("cp-3"), purge=False, drain_timeout=5, all_hosts=False)
    results: list = []
    assert not run_phases([phase], ctx_for(kube, {"cp-1": FakeHost("cp-1")}), results)
    [out] = phase.outcomes
    assert out.id == "reset.host-unreachable" and "etcd member" in out.message
    assert "cp-3" in kube.nodes and [c for c in kube.calls if c[0] != "get"] == []


@pytest.mark.parametrize("names, ready, want", [
    (("cp-3",), ("cp-1", "cp-2", "cp-3"), None),
    (("cp-3",), ("cp-1", "cp-3"), "reset.etcd-quorum"),  # cp-2 is down: cp-1 alone cannot be a quorum of 2
    (("cp-3",), ("cp-1", "cp-2"), None),  # the one that is down goes: 2 of 2 Ready stay
])
def test_quorum_counts_ready_control_planes(names, ready, want):
    got = refusal(INV, hosts(*names), False, ("cp-1", "cp-2", "cp-3"), ready=ready)
    assert (got.id if got else None) == want
    if got:
        assert "Ready" in got.message and "cp-2" in got.message


# -- issue 28 item 13: an etcd --data-dir outside /var/lib is named, never removed --------------------------------

def _etcd_snippet(manifest: str) -> str:
    """reset-node.sh's own lines that read etcd's --data-dir and remove it, run against `manifest`, with `rm` a
    function that only says what it would remove (the rest of the script resets the machine it runs on)."""
    text = node_script(INV, INV.host("cp-2"))
    head = text[text.index("# the etcd data directory of kubeadm's stacked etcd"):text.index("failed=\n")]
    start = text.index('if [ -n "$etcd_dir" ] && [ -d "$etcd_dir" ]')
    tail = text[start:text.index("# kubeconfigs on the host", start)]
    assert head.count("/etc/kubernetes/manifests/etcd.yaml") == 1
    head = head.replace("/etc/kubernetes/manifests/etcd.yaml", shlex.quote(manifest))
    return 'rm() { echo "rm $*"; }\ncontrol_plane=yes\n' + head + tail + 'echo "dir=$etcd_dir"\n'


@pytest.mark.parametrize("line, want, ok", [
    ("    - --data-dir=/var/lib/etcd", "/var/lib/etcd", True),
    ("    - --data-dir=/var/lib/etcd-main/", "/var/lib/etcd-main", True),
    ("    - --listen-peer-urls=https://10.0.0.10:2380", "/var/lib/etcd", True),  # none named: kubeadm's default
    ("    - --data-dir=relative/etcd", "/var/lib/etcd", True),
    ("    - --data-dir=/", "/", False),
    ("    - --data-dir=/home", "/home", False),
    ("    - --data-dir=/var/lib", "/var/lib", False),
    ("    - --data-dir=/var/lib//", "/var/lib", False),
    ("    - --data-dir=/var/lib/../../home/ops", "/var/lib/../../home/ops", False),
    ("    - --data-dir=/var/lib/./etcd", "/var/lib/./etcd", False),
    ("    - --data-dir=/var/libx", "/var/libx", False),
    ("    - --data-dir=/etc", "/etc", False),
    ("    - --data-dir=/var/lib/dpkg", "/var/lib/dpkg", False),  # below /var/lib, but not etcd's (no member/)
    ("    - --data-dir=/var/lib/etcd2", "/var/lib/etcd2", True),
])
def test_reset_removes_etcds_data_dir_only_below_var_lib(tmp_path, line, want, ok):
    import subprocess

    manifest = tmp_path / "etcd.yaml"
    manifest.write_text(f"spec:\n  containers:\n  - command:\n    - etcd\n{line}\n")
    text = node_script(INV, INV.host("cp-2"))
    func = text[text.index("gk_etcd_data_dir() {"):text.index("\n}\n", text.index("gk_etcd_data_dir() {")) + 3]
    p = subprocess.run(["sh", "-c", func + f'gk_etcd_data_dir {shlex.quote(str(manifest))}; echo "rc=$?"'],
                       capture_output=True, text=True)
    assert p.stdout == f"{want}\nrc={0 if ok else 1}\n", p.stdout + p.stderr
    p = subprocess.run(["sh", "-c", _etcd_snippet(str(manifest))], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    if ok:
        assert "@@gpuk8s-etcd-dir-refused" not in p.stdout and f"dir={want}\n" in p.stdout
    else:
        assert f"@@gpuk8s-etcd-dir-refused {want}\n" in p.stdout and "dir=\n" in p.stdout and "rm " not in p.stdout
        assert f"not removed: etcd's --data-dir {want}" in p.stderr


def test_reset_names_and_keeps_a_data_dir_outside_var_lib(tmp_path):
    import subprocess

    victim = tmp_path / "home"
    victim.mkdir()
    (victim / "keep").write_text("mine")
    manifest = tmp_path / "etcd.yaml"
    manifest.write_text(f"    - --data-dir={victim}\n")
    p = subprocess.run(["sh", "-c", _etcd_snippet(str(manifest)).replace('rm() { echo "rm $*"; }\n', "")],
                       capture_output=True, text=True)  # the real rm: still nothing removed
    assert f"@@gpuk8s-etcd-dir-refused {victim}\n" in p.stdout and (victim / "keep").read_text() == "mine"

    class Refused(FakeHost):
        def run(self, command: str, **kw: object) -> Result:
            if "kubeadm reset -f" in command:
                self.ran.append(command)
                return Result(command, 0, "@@gpuk8s-etcd-dir-refused /ho\x1bme\n@@gpuk8s-reset-done\n", "", 0.0)
            return super().run(command, **kw)

    kube = cluster("cp-1", "cp-2", "cp-3")
    phase = Reset(hosts("cp-3"), purge=False, drain_timeout=5, all_hosts=False)
    assert run_phases([phase], ctx_for(kube, {"cp-1": FakeHost("cp-1"), "cp-3": Refused("cp-3")}), [])
    [out] = phase.outcomes
    assert out.status == "reset" and "etcd's --data-dir /home kept: not below /var/lib" in out.message
    assert "check /home on cp-3" in out.remedy and "\x1b" not in out.message + out.remedy
