"""Issue 41: `gpuk8s allocator` kept the former allocator in memory only, so a move stopped after the relabel and
failing on the re-run "put back" the node onto its target. The node as it was is now recorded in kube-system
(kube/moves.py) when the move starts, read back by a re-run, and dropped when the move ends."""

from __future__ import annotations

import json

from gpuk8s import gpuplan
from gpuk8s.kube import moves
from tests.unit.fakekube import FakeKube

ON_DRA = {gpuplan.ALLOCATOR_LABEL: "dra", gpuplan.COUNT_LABEL: "4"}


def test_a_stopped_moves_record_wins_over_the_labels_the_node_has_now() -> None:
    kube = FakeKube()
    assert moves.record(kube, "w-a", "dra", ON_DRA, "device-plugin") == ("dra", ON_DRA)  # the first run: recorded
    cm = kube.objects[("configmap", moves.NAMESPACE, moves.NAME)]
    assert json.loads(cm["data"]["w-a"]) == {"was": "dra", "labels": ON_DRA, "to": "device-plugin"}
    # the run stopped after relabelling w-a onto the device plugin; the re-run sees the target's labels
    now = {gpuplan.CONFIG_LABEL: "whole", gpuplan.COUNT_LABEL: "4"}
    assert moves.record(kube, "w-a", "device-plugin", now, "device-plugin") == ("dra", ON_DRA)
    # a record of a move to another target is stale (that move ended some other way): replaced
    assert moves.record(kube, "w-a", "device-plugin", now, "dra") == ("device-plugin", now)
    moves.record(kube, "w-b", "device-plugin", now, "dra")
    moves.forget(kube, "w-a")
    assert set(kube.objects[("configmap", moves.NAMESPACE, moves.NAME)]["data"]) == {"w-b"}
    moves.forget(kube, "w-b")  # the last one: the ConfigMap goes
    assert ("configmap", moves.NAMESPACE, moves.NAME) not in kube.objects
    moves.forget(kube, "w-b")  # nothing recorded: nothing done
    assert [c for c in kube.writes if c[0] == "delete"] == [("delete", "configmap", moves.NAME)]


def test_a_record_gpuk8s_did_not_write_or_cannot_read_is_not_trusted() -> None:
    kube = FakeKube()
    kube.objects[("configmap", moves.NAMESPACE, moves.NAME)] = {
        "kind": "ConfigMap", "metadata": {"name": moves.NAME, "namespace": moves.NAMESPACE},
        "data": {"w-a": json.dumps({"was": "dra", "labels": ON_DRA, "to": "device-plugin"})}}
    assert moves.record(kube, "w-a", "device-plugin", {}, "device-plugin") == ("device-plugin", {})  # not gpuk8s's
    foreign_key = json.dumps({"was": "dra", "labels": {"kubernetes.io/hostname": "x", gpuplan.ALLOCATOR_LABEL: "dra"},
                              "to": "device-plugin"})
    for bad in ("[", json.dumps({"was": "evil", "labels": {}}), "x" * (moves.MAX_RECORD + 1), foreign_key):
        kube = FakeKube()
        moves.record(kube, "w-b", "device-plugin", {}, "device-plugin")
        kube.objects[("configmap", moves.NAMESPACE, moves.NAME)]["data"]["w-a"] = bad
        got = moves.record(kube, "w-a", "device-plugin", {gpuplan.COUNT_LABEL: "2"}, "device-plugin")
        if bad == foreign_key:
            assert got == ("dra", {gpuplan.ALLOCATOR_LABEL: "dra"})  # only gpuk8s's own label keys are read
        else:
            assert got == ("device-plugin", {gpuplan.COUNT_LABEL: "2"})
