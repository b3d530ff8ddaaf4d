"""kubectl reads that hold at scale: a list over the 1 MiB other commands are cut at is read whole (over real SSH,
against the scripted host of tests/unit/hostile_ssh.py), and a read over the kube client's cap is an error that
names its size, never a list with objects missing."""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path
from typing import Any

import pytest

from gpuk8s.inventory.loader import load
from gpuk8s.kube import client
from gpuk8s.kube.client import KubeError, LocalKubectl, SSHKubectl
from gpuk8s.remote import MAX_OUTPUT, Session
from tests.unit import hostile_ssh
from tests.unit.hostile_ssh import HostileSSH
from tests.unit.test_status import node, pod

hostile_host = hostile_ssh.hostile_host  # the fixture

NOTE = "x" * 4096  # an ordinary tenant's 4 KB annotation


def big_pods(n: int) -> dict[str, Any]:
    pods = [pod(f"web-{i}", "gpu-a", {"cpu": 1}) for i in range(n)]
    for p in pods:
        p["metadata"]["annotations"] = {"example.com/config": NOTE}
    pods += [pod("train", "gpu-a", {"nvidia.com/gpu": 3})]
    return {"apiVersion": "v1", "kind": "List", "items": pods}


NODES = {"apiVersion": "v1", "kind": "List", "items": [node("cp-1", {}), node("gpu-a", {"nvidia.com/gpu": 8})]}


def kubectl_answer(pods: dict[str, Any]):
    text = json.dumps(pods)

    def answer(command: str) -> hostile_ssh.Answer:
        if "get nodes" in command:
            return json.dumps(NODES), "", 0
        if "get pods" in command:
            return text, "", 0
        return "", f"not scripted: {command[:80]}", 1

    return answer


def test_status_reads_a_pod_list_larger_than_1_mib(run_cli, hostile_host: HostileSSH) -> None:
    pods = big_pods(300)
    assert len(json.dumps(pods)) > 1.2 * MAX_OUTPUT
    hostile_host.answer = kubectl_answer(pods)
    r = run_cli("status", "-i", str(hostile_host.inventory), "-o", "json")
    assert r.returncode == 0, r.stdout + r.stderr
    out = json.loads(r.stdout)
    [gpu_a] = [n for n in out["nodes"] if n["node"] == "gpu-a"]
    [res] = gpu_a["resources"]
    assert (res["allocatable"], res["requested"], res["free"]) == (8, 3, 5)
    assert [p["name"] for p in res["pods"]] == ["train"]


def test_a_read_over_the_cap_is_an_error_naming_its_size(hostile_host: HostileSSH,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    pods = big_pods(300)
    size = len(json.dumps(pods))
    hostile_host.answer = kubectl_answer(pods)
    monkeypatch.setattr(client, "READ_CAP", MAX_OUTPUT)
    with Session(load(hostile_host.inventory).hosts[0]) as s:
        kube = SSHKubectl(s)
        assert len(kube.get("nodes")) == 2  # small reads go on as before
        with pytest.raises(KubeError) as e:
            kube.get("pods", namespace="*")
    assert f"printed {size} bytes" in e.value.message and "1 MiB" in e.value.message


def fake_kubectl(tmp_path: Path, payload: Path) -> Path:
    exe = tmp_path / "bin" / "kubectl"
    exe.parent.mkdir()
    exe.write_text(f"#!/bin/sh\ncat {payload}\n")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return exe


def test_local_kubectl_reads_whole_lists_and_refuses_one_over_the_cap(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    payload = tmp_path / "pods.json"
    payload.write_text(json.dumps(big_pods(600)))
    size = payload.stat().st_size
    assert size > 2 * MAX_OUTPUT
    fake_kubectl(tmp_path, payload)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    kube = LocalKubectl(str(tmp_path / "kc.yaml"))
    assert len(kube.get("pods", namespace="*")) == 601
    monkeypatch.setattr(client, "READ_CAP", MAX_OUTPUT)
    with pytest.raises(KubeError) as e:
        kube.get("pods", namespace="*")
    # the count when kubectl was stopped: all of it, or (on a loaded machine) what it had written once past the cap
    printed = int(re.search(r"printed (\d+) bytes", e.value.message).group(1))  # type: ignore[union-attr]
    assert MAX_OUTPUT < printed <= size and "more than the 1 MiB" in e.value.message


def test_a_probe_output_past_what_its_sections_can_add_up_to_is_an_error(run_cli, hostile_host: HostileSSH) -> None:
    """Cut silently, the probe's last sections would read as missing (no containerd, no kubelet...): a host that
    prints more than the probe's section caps add up to is named, its facts not read."""
    from gpuk8s.preflight.runner import PROBE_MAX_OUTPUT

    padding = "@@gpuk8s-begin os-release\n" + ("x" * 1023 + "\n") * (PROBE_MAX_OUTPUT // 1024 + 8)
    hostile_host.answer = lambda command: (padding + hostile_ssh.PROBE, "", 0) if "@@gpuk8s-begin" in command \
        else ("", "no", 1)
    r = run_cli("preflight", "--no-network", "-i", str(hostile_host.inventory), "-o", "json")
    assert r.returncode == 1, r.stdout + r.stderr
    [host] = json.loads(r.stdout)["hosts"]
    [c] = [c for c in host["checks"] if c["id"] == "ssh.reachable"]
    assert c["status"] == "fail" and f"printed {len(padding) + len(hostile_ssh.PROBE)} bytes" in c["message"]


def test_local_kubectl_is_stopped_once_past_the_cap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A kubectl (or an API server behind it) that never stops writing is killed once past the cap, not left to
    fill the disk until its timeout."""
    import time

    exe = tmp_path / "bin" / "kubectl"
    exe.parent.mkdir()
    exe.write_text("#!/bin/sh\nexec yes '{\"items\": []}'\n")
    exe.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    monkeypatch.setattr(client, "READ_CAP", MAX_OUTPUT)
    kube = LocalKubectl(str(tmp_path / "kc.yaml"), timeout=60)
    t0 = time.monotonic()
    with pytest.raises(KubeError) as e:
        kube.get("pods", namespace="*")
    assert time.monotonic() - t0 < 30
    assert "more than the 1 MiB" in e.value.message


def test_a_tenants_huge_log_is_read_cut_not_refused(hostile_host: HostileSSH) -> None:
    """A pod's log is the tenant's text: kubectl is asked for at most LOG_CAP bytes, and a longer answer is cut
    (its last lines are what doctor shows), never an error or a 128 MiB read."""
    big = "x" * 1000 + "\n"

    def answer(command: str) -> hostile_ssh.Answer:
        return (big * (3 * client.LOG_CAP // len(big)), "", 0) if " logs " in command else ("", "no", 1)

    hostile_host.answer = answer
    with Session(load(hostile_host.inventory).hosts[0]) as s:
        text = SSHKubectl(s).logs("train", "ml", tail=20)
    command = hostile_host.execs[-1][0]
    assert f"--limit-bytes={client.LOG_CAP}" in command
    assert client.LOG_CAP < len(text) <= 2 * client.LOG_CAP


class Scripted(client.Kubectl):
    """kubectl's answers by argv, recorded: what get_refs asks and how it reads the answers."""

    def __init__(self, answers: dict[str, client.Output]) -> None:
        self.answers, self.calls = answers, []

    def _kubectl(self, args: list[str], stdin: str | None = None, timeout: float | None = None,
                 cap: int | None = None) -> client.Output:
        self.calls.append(" ".join(args))
        return self.answers.get(" ".join(args), client.Output(False, "", "Error from server (NotFound): x\n"))


def _obj(kind: str, name: str, ns: str | None = "kube-system") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": kind, "metadata": {"name": name, **({"namespace": ns} if ns else {})}}


REFS = [("ConfigMap", "a", "kube-system"), ("DaemonSet", "b", "kube-system"), ("ClusterRole", "c", "kube-system"),
        ("RuntimeClass", "nvidia", None)]
ONE_CALL = "get configmap/a daemonset/b clusterrole/c -n kube-system --ignore-not-found -o json"


def test_many_objects_are_read_in_one_call_per_namespace() -> None:
    listed = {"apiVersion": "v1", "kind": "List", "items": [_obj("ConfigMap", "a"), _obj("ClusterRole", "c", None)]}
    k = Scripted({ONE_CALL: client.Output(True, json.dumps(listed, indent=4), ""),
                  "get runtimeclass/nvidia --ignore-not-found -o json":
                      client.Output(True, json.dumps(_obj("RuntimeClass", "nvidia", None)), "")})
    found = k.get_refs(REFS + [REFS[0]])
    assert set(found) == {REFS[0], REFS[2], REFS[3]}  # b is not there; one name prints the object itself
    assert found[REFS[2]]["kind"] == "ClusterRole"
    assert len(k.calls) == 2


def test_none_found_prints_nothing_and_is_not_an_error() -> None:
    k = Scripted({ONE_CALL: client.Output(True, "", "")})
    assert k.get_refs(REFS[:3]) == {}


def test_a_failed_batch_is_read_object_by_object() -> None:
    """A kind the cluster does not serve fails the whole call; the others are still read, that one is absent."""
    cm = json.dumps(_obj("ConfigMap", "a"))
    k = Scripted({ONE_CALL: client.Output(False, "", 'error: the server doesn\'t have a resource type "daemonset"'),
                  "get configmap a -n kube-system -o json": client.Output(True, cm, "")})
    assert set(k.get_refs(REFS[:3])) == {REFS[0]}
    assert k.calls[1:] == ["get configmap a -n kube-system -o json", "get daemonset b -n kube-system -o json",
                           "get clusterrole c -n kube-system -o json"]


def test_an_object_that_cannot_be_read_is_an_error_not_absent() -> None:
    """Unread is not absent: claimable would apply over a user's object it could not see (a timeout, a proxy error),
    and reset would keep one. Only a kind the API server does not serve counts as no such object."""
    timeout = client.Output(False, "", "Unable to connect to the server: dial tcp 10.0.0.1:6443: i/o timeout\n")
    unserved = 'error: the server doesn\'t have a resource type "daemonset"'
    k = Scripted({ONE_CALL: client.Output(False, "", unserved),
                  "get configmap a -n kube-system -o json": timeout})
    with pytest.raises(KubeError, match="i/o timeout"):
        k.get_refs(REFS[:3])
    k = Scripted({ONE_CALL: client.Output(False, "", unserved),
                  "get daemonset b -n kube-system -o json": client.Output(False, "", unserved)})
    assert k.get_refs(REFS[:3]) == {}


def test_a_batch_answer_that_is_not_json_is_an_error() -> None:
    k = Scripted({ONE_CALL: client.Output(True, "<html>proxy error</html>", "")})
    with pytest.raises(KubeError, match="no JSON"):
        k.get_refs(REFS[:3])


def test_ownership_and_freshness_are_read_in_one_call_each_not_one_per_object() -> None:
    """The no-op install read the GPU manifests' anchors and HAMi's 12 objects one kubectl call each (16 calls,
    ~1 s on the lab, 2-3 s on a real control plane): now one each, and ownership is still judged per object."""
    from gpuk8s.kube import manifests
    from tests.unit.fakekube import FakeKube

    kube = FakeKube()
    mine, theirs = _obj("ClusterRole", "hami-scheduler", None), _obj("ServiceAccount", "hami-scheduler")
    mine["metadata"]["annotations"] = {manifests.ANNOTATION: "0" * 64}
    kube.objects[("clusterrole", "", "hami-scheduler")] = mine
    kube.objects[("serviceaccount", "kube-system", "hami-scheduler")] = theirs  # Helm's, not gpuk8s's
    refs = [("ClusterRole", "hami-scheduler", "kube-system"), ("ServiceAccount", "hami-scheduler", "kube-system"),
            ("Deployment", "hami-scheduler", "kube-system")]
    assert manifests.owned(kube, refs * 3) == refs[:1]
    assert [c[0] for c in kube.calls] == ["get_refs"]


def _cluster_answer(pods: dict[str, Any]):
    """kubectl on the scripted control plane: nodes, the >1 MiB pod list, no events, and NotFound for any named
    object (no device plugin, no HAMi); anything else (the probe of a node over SSH) as the H200 host answers."""
    listed = kubectl_answer(pods)

    def answer(command: str) -> hostile_ssh.Answer:
        if "kubectl" not in command:
            return hostile_ssh.probe_answer(command)
        if "get events" in command:
            return json.dumps({"apiVersion": "v1", "kind": "List", "items": []}), "", 0
        if "get nodes" in command or "get pods" in command:
            return listed(command)
        return "", 'Error from server (NotFound): daemonsets.apps "x" not found\n', 1

    return answer


def test_doctor_reads_a_pod_list_larger_than_1_mib(run_cli, hostile_host: HostileSSH) -> None:
    pods = big_pods(300)
    pods["items"].append(pod("big", None, {"nvidia.com/gpu": 16}, phase="Pending"))  # more GPUs than any node has
    assert len(json.dumps(pods)) > 1.2 * MAX_OUTPUT
    hostile_host.answer = _cluster_answer(pods)
    r = run_cli("doctor", "-i", str(hostile_host.inventory), "-o", "json")
    assert r.returncode == 1, r.stdout + r.stderr  # a cause found, not "kubectl printed no JSON"
    out = json.loads(r.stdout)
    assert out["checked"]["pods"] == ["ml/big"]
    assert any("ml/big" in json.dumps(f["subject"]) for f in out["findings"]), out["findings"]


def test_verify_reads_node_and_pod_lists_larger_than_1_mib(run_cli, hostile_host: HostileSSH) -> None:
    """verify reads kube-system's pods and every node; a list past 1 MiB is read whole (no SSH probe: --no-test-pods
    and one node's verdict from the cluster's objects)."""
    pods = big_pods(300)
    for p in pods["items"]:
        p["metadata"]["namespace"] = "kube-system"
    assert len(json.dumps(pods)) > 1.2 * MAX_OUTPUT
    hostile_host.answer = _cluster_answer(pods)
    r = run_cli("verify", "-i", str(hostile_host.inventory), "-o", "json", "--no-test-pods")
    out = json.loads(r.stdout)
    assert "no JSON" not in r.stdout + r.stderr
    assert [n["node"] for n in out["nodes"]] == ["cp-1"], out
