"""The CLI surface: exit codes, --version, inventory validate/init, JSON on bad input."""

from __future__ import annotations

import json

import pytest

from gpuk8s import __version__


def test_version(run_cli):
    r = run_cli("--version")
    assert r.returncode == 0 and r.stdout.strip() == f"gpuk8s {__version__}"


def test_validate_bad_inventory_exits_2_with_locations(run_cli, tmp_path):
    (tmp_path / "inventory.yaml").write_text("hosts:\n  - name: Bad_Name\n    adress: 10.0.0.1\n")
    r = run_cli("inventory", "validate")  # found as ./inventory.yaml
    assert r.returncode == 2
    assert "inventory.yaml:2:11: error: hosts[0].name:" in r.stderr
    assert "inventory.yaml:3:5: error: hosts[0].adress: unknown key 'adress' (fix: did you mean 'address'?)" in r.stderr
    assert "nothing was done" in r.stderr


def test_validate_json_and_env_variable(run_cli, tmp_path):
    f = tmp_path / "x.yaml"
    f.write_text("hosts:\n  - {name: cp, address: 10.0.0.1, role: worker}\n")
    r = run_cli("inventory", "validate", "-o", "json", env={"GPUK8S_INVENTORY": str(f)})
    assert r.returncode == 2
    out = json.loads(r.stdout)
    assert out["valid"] is False and out["problems"][0]["key"] == "hosts"


def test_preflight_on_bad_inventory_contacts_nothing(run_cli, tmp_path):
    f = tmp_path / "x.yaml"
    f.write_text("hosts:\n  - {name: cp, address: 192.0.2.1, role: control-plane, gpus: many}\n")
    r = run_cli("preflight", "-i", str(f), timeout=20)
    assert r.returncode == 2 and "hosts[0].gpus" in r.stderr


def test_missing_inventory(run_cli):
    r = run_cli("inventory", "validate", "-i", "nope.yaml")
    assert r.returncode == 2 and "cannot read the inventory" in r.stderr and "gpuk8s inventory init" in r.stderr


def test_init_writes_a_valid_starter_and_refuses_to_overwrite(run_cli, tmp_path):
    r = run_cli("inventory", "init")
    assert r.returncode == 0
    assert run_cli("inventory", "validate").returncode == 0
    before = (tmp_path / "inventory.yaml").read_text()
    r = run_cli("inventory", "init")
    assert r.returncode == 2 and "not overwritten" in r.stderr
    assert (tmp_path / "inventory.yaml").read_text() == before


BASE = "hosts:\n  - name: cp-1\n    address: 10.0.0.1\n    role: control-plane\n"


@pytest.mark.parametrize("text,where", [
    ("hosts: [\n", "inv.yaml:2:1: error:"),                                       # YAML syntax
    (BASE + "  - name: w\n    adress: 10.0.0.2\n", "inv.yaml:6:5: error: hosts[1].adress"),  # unknown key
    (BASE.replace("10.0.0.1", "10.0.0.1\n    gpus: many"), "inv.yaml:4:11: error: hosts[0].gpus"),  # type
    (BASE + BASE.split("\n", 1)[1], "inv.yaml:5:11: error: hosts[1].name: duplicate"),  # duplicate
    (BASE.replace("10.0.0.1", "10.0.0.999"), "inv.yaml:3:14: error: hosts[0].address"),  # address
    (BASE + "ssh:\n  port: 99999\n", "inv.yaml:6:9: error: ssh.port"),            # port
    (BASE.replace("cp-1", "CP_1"), "inv.yaml:2:11: error: hosts[0].name"),       # node name
    (BASE.replace("control-plane", "worker"), "inv.yaml:2:3: error: hosts: no host has role"),  # no control plane
    (BASE + "ssh:\n  password: x1y2z3\n", "inv.yaml:6:3: error: ssh.password"),  # clear-text password
])
def test_each_error_class_exits_2_with_its_location(run_cli, tmp_path, text, where):
    (tmp_path / "inv.yaml").write_text(text)
    r = run_cli("inventory", "validate", "-i", "inv.yaml")
    assert r.returncode == 2
    assert where in r.stderr, r.stderr
    assert "x1y2z3" not in r.stderr


def test_even_control_planes_warn_but_exit_0(run_cli, tmp_path):
    (tmp_path / "inv.yaml").write_text(BASE + BASE.split("\n", 1)[1].replace("cp-1", "cp-2").replace(".1\n", ".2\n"))
    r = run_cli("inventory", "validate", "-i", "inv.yaml")
    assert r.returncode == 0 and "warning: hosts: 2 stacked control planes" in r.stderr
