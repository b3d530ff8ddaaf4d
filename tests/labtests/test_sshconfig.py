"""The operator's ~/.ssh/config on the lab: a host reached only through an alias and a ProxyJump, the inventory's
values winning over the file, and ssh.config_file: none."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import pytest
import yaml

from gpuk8s.inventory import load
from gpuk8s.remote import RemoteError, Session

FLEET = """
hosts:
  - name: jump
    role: control-plane
  - name: gpu-1
    gpus: 1
"""


def setup(lab, tmp_path: Path, gpu_ssh: dict, top_ssh: dict | None = None) -> Path:
    """An ssh config naming gpu-1 'lab-gpu' behind 'lab-jump', gpu-1 unreachable from here, and an inventory."""
    jump, gpu = lab.host("jump"), lab.host("gpu-1")
    gateway = str(lab.fleet.subnet.network_address + 1)  # this machine's address on the lab bridge
    gpu.block(gateway)  # gpu-1 answers nothing from here: only the jump host reaches it
    cfg = tmp_path / "ssh_config"
    cfg.write_text(f"""# an operator's config
Host lab-gpu
    HostName {gpu.address}
    ProxyJump lab-jump
Host lab-*
    User gpuk8s
    IdentityFile {lab.key}
Host lab-jump
    HostName {jump.address}
""")
    inv = yaml.safe_load(lab.inventory.read_text())
    inv["ssh"] = {"known_hosts": str(lab.known_hosts), "connect_timeout": 3, "config_file": str(cfg),
                  **(top_ssh or {})}
    for h in inv["hosts"]:
        if h["name"] == "gpu-1":
            h["ssh"] = {"alias": "lab-gpu", **gpu_ssh}
        else:
            h["ssh"] = {"user": "gpuk8s", "identity_file": str(lab.key)}
    path = tmp_path / "inventory.yaml"
    path.write_text(yaml.safe_dump(inv, sort_keys=False))
    return path


def test_host_reached_only_through_alias_and_proxyjump(lab_up, tmp_path, run_cli):
    lab = lab_up(FLEET)
    gpu = lab.host("gpu-1")
    path = setup(lab, tmp_path, {})
    inv = load(path)
    # same key and user, straight at gpu-1's address: no answer
    direct = Session(dataclasses.replace(inv.host("gpu-1"), ssh=inv.host("jump").ssh))
    with pytest.raises(RemoteError) as e:
        direct.connect()
    assert e.value.kind in ("timeout", "unreachable")
    t0 = time.monotonic()
    with Session(inv.host("gpu-1")) as s:
        r = s.run("hostname; id -un")
        assert s.target is not None and [h.address for h in s.target.chain()] == [lab.host("jump").address,
                                                                                   gpu.address]
    seconds = time.monotonic() - t0
    assert r.stdout.split() == ["gpu-1", "gpuk8s"], r
    assert seconds < 10
    # end to end: preflight reaches gpu-1 the same way
    p = run_cli("preflight", "-i", str(path), "-o", "json", "--network-seconds", "0")
    report = json.loads(p.stdout)
    checks = {h["name"]: {c["id"]: c for c in h["checks"]} for h in report["hosts"]}
    assert checks["gpu-1"]["ssh.reachable"]["status"] == "pass", checks["gpu-1"]["ssh.reachable"]
    assert checks["gpu-1"]["gpu.count"]["status"] == "pass"


def test_inventory_values_win_over_the_config_file(lab_up, tmp_path):
    lab = lab_up(FLEET)
    path = setup(lab, tmp_path, {"user": "root"})  # the config says User gpuk8s
    with Session(load(path).host("gpu-1")) as s:
        assert s.run("id -un").stdout.strip() == "root"
    # the inventory's bastion wins over the config's ProxyJump: a bastion that is not there fails
    path = setup(lab, tmp_path, {"bastion": {"address": "10.255.255.1", "user": "nobody"}})
    with pytest.raises(RemoteError), Session(load(path).host("gpu-1")) as s:
        s.connect()


def test_config_file_none_ignores_the_alias_file(lab_up, tmp_path):
    lab = lab_up(FLEET)
    path = setup(lab, tmp_path, {"user": "gpuk8s", "identity_file": str(lab.key)}, {"config_file": "none"})
    inv = load(path)
    assert inv.host("gpu-1").ssh.config_file == "none"
    with pytest.raises(RemoteError) as e, Session(inv.host("gpu-1")) as s:
        s.connect()  # straight at gpu-1's address: blocked
    assert e.value.kind in ("timeout", "unreachable")
    assert lab.host("gpu-1").address in e.value.message
