"""Hostile inventory values: every field that can reach a remote shell rejects shell metacharacters.

Each (field, value) pair is validated on its own; a rejection must point at the line of the value and
say what to write instead. The only fields that accept such values are local file paths, which never
reach a shell; tests/labtests/test_faults.py runs a whole install with them and a canary.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml

from gpuk8s.inventory import loader

CANARY = "/var/tmp/gpuk8s-canary"
VALUES = [
    f"x;touch {CANARY}", f"$(touch {CANARY})", f"`touch {CANARY}`", f"x' ; touch {CANARY}; '",
    f'x"$(touch {CANARY})"', f"x\ntouch {CANARY}", f"https://example.com/a;touch {CANARY}",
    f"https://example.com/$(touch {CANARY})", f"1.30 && touch {CANARY}", f"v0.17.1|touch {CANARY}",
]
BASE: dict[str, Any] = {
    "cluster": {"name": "lab", "kubernetes_version": "1.30"},
    "ssh": {"user": "gpuk8s", "identity_file": "/tmp/k", "known_hosts": "/tmp/kh"},
    "hosts": [{"name": "cp-1", "address": "10.0.0.1", "role": "control-plane"},
              {"name": "gpu-1", "address": "10.0.0.2", "gpus": 2, "labels": {"team": "a"},
               "taints": ["a=b:NoSchedule"]}],
}
FIELDS = [
    "hosts.0.name", "hosts.1.address", "hosts.1.labels.KEY", "hosts.1.labels.team", "hosts.1.taints.0",
    "hosts.1.ssh.user", "cluster.name", "cluster.kubernetes_version", "cluster.pod_cidr", "cluster.service_cidr",
    "cluster.control_plane_endpoint", "ssh.user", "ssh.sudo.password_env", "ssh.bastion.address",
    "ssh.bastion.user", "install.toolkit_version", "install.toolkit_repo", "install.kubernetes_repo",
    "install.device_plugin_version", "install.calico_manifest", "install.flannel_manifest", "install.verify_image",
]
LOCAL_PATHS = ["ssh.identity_file", "ssh.known_hosts"]


def with_value(field: str, value: str) -> dict[str, Any]:
    d = copy.deepcopy(BASE)
    if field == "ssh.bastion.address" or field == "ssh.bastion.user":
        d["ssh"]["bastion"] = {"address": "jump.example.com", "user": "ops"}
    *path, last = field.split(".")
    cur: Any = d
    for k in path:
        cur = cur[int(k)] if k.isdigit() else cur.setdefault(k, {})
    if last == "KEY":
        cur.clear()
        cur[value] = "a"
    elif last.isdigit():
        cur[int(last)] = value
    else:
        cur[last] = value
    return d


@pytest.mark.parametrize("value", VALUES)
@pytest.mark.parametrize("field", FIELDS)
def test_metacharacters_are_rejected_with_a_location_and_a_fix(field: str, value: str) -> None:
    text = yaml.safe_dump(with_value(field, value), sort_keys=False)
    with pytest.raises(loader.InventoryError) as e:
        loader.loads(text, "inv.yaml")
    errors = [p for p in e.value.problems if p.severity == "error"]
    assert errors, field
    p = errors[0]
    assert p.line > 0 and p.fix, (field, str(p))
    # the problem points at the line that holds the value: its key, or the value itself in a list or a key
    line = text.splitlines()[p.line - 1]
    last = field.split(".")[-1]
    holds = ("touch" in line or "'x" in line) if last.isdigit() or last == "KEY" else f"{last}:" in line
    assert holds, (field, line, str(p))
    assert CANARY not in str(p.fix)


@pytest.mark.parametrize("value", VALUES[:6])
@pytest.mark.parametrize("field", LOCAL_PATHS)
def test_local_paths_may_hold_metacharacters_they_never_reach_a_shell(field: str, value: str) -> None:
    d = with_value(field, value.replace("\n", " "))
    inv = loader.loads(yaml.safe_dump(d), "inv.yaml")
    assert value.replace("\n", " ") in (inv.ssh.identity_file or "", inv.ssh.known_hosts)
