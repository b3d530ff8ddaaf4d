"""The inventory loader: every error class, with its message, location and the CLI's exit status."""

from __future__ import annotations

import contextlib
import resource
import textwrap
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuk8s import versions
from gpuk8s.inventory import InventoryError, load, loads

GOOD = """\
cluster:
  name: lab
  kubernetes_version: "1.30"
ssh:
  user: ops
hosts:
  - name: cp-1
    address: 10.0.0.10
    role: control-plane
  - name: gpu-1
    address: 10.0.0.11
    gpus: 8
    labels: {team: ml}
    taints: ["nvidia.com/gpu=present:NoSchedule"]
    ssh: {user: admin, port: 2222}
"""


def problems(text: str) -> list:
    with pytest.raises(InventoryError) as e:
        loads(textwrap.dedent(text), "inv.yaml")
    return e.value.problems


def one_error(text: str):
    errs = [p for p in problems(text) if p.severity == "error"]
    assert len(errs) == 1, errs
    return errs[0]


def test_good_inventory_and_host_overrides_win():
    inv = loads(GOOD, "inv.yaml")
    assert [h.name for h in inv.hosts] == ["cp-1", "gpu-1"]
    cp, gpu = inv.hosts
    assert cp.ssh.user == "ops" and cp.ssh.port == 22
    assert gpu.ssh.user == "admin" and gpu.ssh.port == 2222
    assert gpu.gpus == 8 and gpu.labels == {"team": "ml"}
    assert str(gpu.taints[0]) == "nvidia.com/gpu=present:NoSchedule"
    assert inv.cluster.kubernetes_version == "1.30"
    assert gpu.line == 10


def test_yaml_syntax_error_is_located():
    p = one_error("hosts:\n  - name: a\n    address: [1.2.3.4\n")
    assert p.file == "inv.yaml" and p.line >= 3
    assert "YAML syntax error" in p.message


def test_unknown_key_suggests_the_nearest():
    p = one_error(GOOD.replace("    role: control-plane", "    rol: control-plane\n    role: control-plane"))
    assert (p.line, p.column) == (9, 5)
    assert p.key == "hosts[0].rol"
    assert "did you mean 'role'" in p.fix


def test_wrong_type_names_what_to_write():
    p = one_error(GOOD.replace("gpus: 8", "gpus: eight"))
    assert p.key == "hosts[1].gpus" and "whole number" in p.message and p.line == 12


def test_version_as_float_is_caught():
    p = one_error(GOOD.replace('"1.30"', "1.30"))
    assert p.key == "cluster.kubernetes_version" and 'quote it: "1.30"' in p.fix
    assert p.message == "1.30 was read as a number, which loses digits (1.30 becomes 1.3)"


MINIMAL = "hosts:\n  - {name: cp-1, address: 10.0.0.10, role: control-plane}\n"


def test_without_kubernetes_version_the_default_minor_and_its_pins_are_installed():
    inv = loads(MINIMAL)
    default = versions.default_minor()
    assert inv.cluster.kubernetes_version == default
    p = versions.pins(default)
    assert (inv.install.toolkit_version, inv.install.device_plugin_version, inv.install.calico_manifest,
            inv.install.flannel_manifest) == (p.toolkit, p.device_plugin, p.calico.url, p.flannel.url)


@pytest.mark.parametrize("minor", versions.supported_minors())
def test_every_minor_of_the_matrix_is_accepted_with_its_pins(minor):
    inv = loads(f'cluster: {{kubernetes_version: "{minor}"}}\n' + MINIMAL)
    assert inv.cluster.kubernetes_version == minor and inv.warnings == ()
    assert inv.install.toolkit_version == versions.pins(minor).toolkit
    assert inv.install.device_plugin_version == versions.pins(minor).device_plugin
    patch = versions.kubernetes(minor).latest_patch
    assert loads(f'cluster: {{kubernetes_version: "v{patch}"}}\n' + MINIMAL).cluster.kubernetes_version == patch


def test_the_minor_chooses_the_pins_and_install_keys_override_them():
    old = loads(GOOD)  # "1.30": end of life before the matrix, the pins gpuk8s had for it
    assert old.install.toolkit_version == versions.pins("1.30").toolkit != versions.pins().toolkit
    mine = loads(GOOD + 'install:\n  toolkit_version: "1.18.0-1"\n  device_plugin_version: v0.19.2\n')
    assert (mine.install.toolkit_version, mine.install.device_plugin_version) == ("1.18.0-1", "v0.19.2")
    assert mine.install.calico_manifest == versions.pins("1.30").calico.url  # the keys not written: the pins


@pytest.mark.parametrize("version", ["1.28", "1.99", "1.28.15", "1.99.0"])
def test_an_unknown_minor_is_an_error_at_its_line_with_the_supported_list(version):
    p = one_error(GOOD.replace('"1.30"', f'"{version}"'))
    assert (p.file, p.line, p.column, p.key) == ("inv.yaml", 3, 23, "cluster.kubernetes_version")
    minor = ".".join(version.split(".")[:2])
    assert p.message == (f"gpuk8s does not install Kubernetes {minor}; the minors it installs are "
                         + ", ".join(reversed(versions.supported_minors())))
    assert p.fix.startswith(f'write one of them, e.g. "{versions.default_minor()}" (the default)')
    assert str(p).startswith("inv.yaml:3:23: error: cluster.kubernetes_version: gpuk8s does not install")


@pytest.mark.parametrize("version", ["2.0", "1", "1.30.1.1", "latest", "1.30-rc.1"])
def test_a_version_that_is_no_kubernetes_version(version):
    p = one_error(GOOD.replace('"1.30"', f'"{version}"'))
    assert p.key == "cluster.kubernetes_version" and "is not a Kubernetes version" in p.message


def test_duplicate_names_and_addresses():
    text = GOOD + "  - name: gpu-1\n    address: 10.0.0.11\n"
    ps = problems(text)
    msgs = [p.message for p in ps]
    assert any("duplicate host name 'gpu-1' (also on line 10)" in m for m in msgs)
    assert any("duplicate address '10.0.0.11' (also on line 11)" in m for m in msgs)


@pytest.mark.parametrize("addr", ["10.0.0.300", "host_name", "a b", "-bad.example"])
def test_invalid_address(addr):
    p = one_error(GOOD.replace("10.0.0.11", addr))
    assert p.key == "hosts[1].address" and "neither an IP address nor a host name" in p.message


@pytest.mark.parametrize("port", ["0", "70000", "ssh"])
def test_invalid_port(port):
    p = one_error(GOOD.replace("port: 2222", f"port: {port}"))
    assert p.key == "hosts[1].ssh.port"


@pytest.mark.parametrize("name", ["GPU-1", "gpu_1", "gpu-1-", "gpu;rm -rf /", "$(reboot)"])
def test_node_names_must_be_rfc1123(name):
    p = one_error(GOOD.replace("name: gpu-1", f"name: '{name}'"))
    assert p.key == "hosts[1].name" and "RFC 1123" in p.fix


def test_no_control_plane():
    p = one_error(GOOD.replace("role: control-plane", "role: worker"))
    assert "no host has role: control-plane" in p.message and p.key == "hosts"


def test_even_control_planes_is_a_warning_only():
    inv = loads(GOOD.replace("    gpus: 8", "    role: control-plane\n    gpus: 8"), "inv.yaml")
    assert [w.severity for w in inv.warnings] == ["warning"]
    assert "2 stacked control planes" in inv.warnings[0].message


@pytest.mark.parametrize("where", ["ssh:\n  user: ops\n  password: hunter2\n",
                                   "ssh:\n  user: ops\n  sudo:\n    password: hunter2\n"])
def test_clear_text_password_is_an_error_without_echoing_it(where):
    text = GOOD.replace("ssh:\n  user: ops\n", where)
    ps = problems(text)
    p = next(p for p in ps if "secrets must not be written" in p.message)
    assert "password_env" in p.fix
    assert all("hunter2" not in str(q) for q in ps)


def test_all_problems_at_once():
    text = GOOD.replace("gpus: 8", "gpus: -1").replace("port: 2222", "port: 0").replace("name: lab", "name: LAB")
    assert len([p for p in problems(text) if p.severity == "error"]) == 3


def test_bad_taint_and_label():
    ps = problems(GOOD.replace("present:NoSchedule", "present:Never").replace("team: ml", "'bad key!': ml"))
    keys = {p.key for p in ps}
    assert "hosts[1].taints[0]" in keys and "hosts[1].labels.bad key!" in keys


def test_empty_and_non_mapping_documents():
    assert "empty" in one_error("").message
    assert "expected a mapping" in one_error("- a\n- b\n").message


def test_not_utf8():
    with pytest.raises(InventoryError) as e:
        loads(b"hosts: \xff\xfe\n", "inv.yaml")
    assert "UTF-8" in e.value.problems[0].message


def test_overlapping_cidrs():
    p = one_error(GOOD.replace('"1.30"', '"1.30"\n  pod_cidr: 10.0.0.0/8\n  service_cidr: 10.96.0.0/12'))
    assert "overlaps" in p.message


def test_shipped_examples_are_valid(tmp_path, monkeypatch):
    from pathlib import Path

    from typer.testing import CliRunner

    from gpuk8s import versions
    from gpuk8s.cli import app

    root = Path(__file__).resolve().parents[2]
    loads((root / "inventories/example.yaml").read_text(), "inventories/example.yaml")
    # what `gpuk8s inventory init` writes: valid, with the version matrix's defaults
    monkeypatch.chdir(tmp_path)
    assert CliRunner().invoke(app, ["inventory", "init", "starter.yaml"]).exit_code == 0
    inv = loads((tmp_path / "starter.yaml").read_text(), "starter.yaml")
    assert inv.cluster.kubernetes_version == versions.default_minor()
    assert inv.install.toolkit_version == versions.pins().toolkit


# -- size: an inventory is read up to 4 MiB, whatever -i names --------------------------------------


@contextlib.contextmanager
def address_space_cap(extra: int = 1 << 30) -> Iterator[None]:
    """Cap this process's address space at its current size + `extra` for the block, so that unbounded
    reading ends in MemoryError instead of eating the machine."""
    vm = next(int(line.split()[1]) * 1024 for line in Path("/proc/self/status").read_text().splitlines()
              if line.startswith("VmSize:"))
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (vm + extra, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def test_an_oversized_inventory_is_rejected_at_line_1_without_reading_it_all(tmp_path):
    f = tmp_path / "big.yaml"
    f.write_text(GOOD + ("# padding " + "x" * 90 + "\n") * (5 * 1024 * 1024 // 100 + 1))  # valid YAML, 5 MiB
    assert f.stat().st_size > 5 << 20
    tracemalloc.start()
    try:
        with pytest.raises(InventoryError) as e:
            load(f)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    (p,) = e.value.problems
    assert (p.file, p.line, p.severity) == (str(f), 1, "error")
    assert p.message == "the inventory is larger than 4 MiB" and "-i" in p.fix
    assert peak < 12 << 20, peak  # about 4 MiB read, nothing parsed
    with pytest.raises(InventoryError) as e:
        loads(GOOD + "#" * (5 << 20), "inv.yaml")
    assert e.value.problems[0].message == "the inventory is larger than 4 MiB"


def test_cli_oversized_inventory_exits_2(tmp_path):
    from typer.testing import CliRunner

    from gpuk8s.cli import app

    f = tmp_path / "big.yaml"
    f.write_text(GOOD + "#" * (5 << 20) + "\n")
    r = CliRunner().invoke(app, ["inventory", "validate", "-i", str(f)])
    assert r.exit_code == 2, r.output
    assert f"{f}:1:1: error: the inventory is larger than 4 MiB" in r.output


def test_cli_dev_zero_exits_2_quickly_with_bounded_memory():
    from typer.testing import CliRunner

    from gpuk8s.cli import app

    t = time.monotonic()
    with address_space_cap():
        r = CliRunner().invoke(app, ["inventory", "validate", "-i", "/dev/zero"])
    assert r.exit_code == 2, (r.exit_code, r.exception)
    assert "/dev/zero:1:1: error: the inventory is larger than 4 MiB" in r.output
    assert time.monotonic() - t < 10
