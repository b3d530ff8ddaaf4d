"""`gpuk8s inventory import`: Kubespray/Ansible inventories (INI and YAML) mapped onto gpuk8s inventories.

The samples in tests/fixtures/kubespray are written from Kubespray's documented format
(inventory/sample/inventory.ini, docs/ansible/inventory.md); each imported inventory must load with the
gpuk8s loader, and everything not mapped must be listed with its line.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpuk8s.cli import app
from gpuk8s.inventory.kubespray import KubesprayImportError, bastion_of_args, convert, parse, parse_ini
from gpuk8s.inventory.loader import loads

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "kubespray"


def imported(name: str):
    src = FIX / name
    res = convert(parse(src.read_text(), src.name), str(src))
    return res, loads(res.text, "imported.yaml")


def notes_by_line(res) -> dict[int, list[str]]:
    out: dict[int, list[str]] = {}
    for n in res.notes:
        out.setdefault(n.line, []).append(n.key)
    return out


def test_ini_sample_roles_connection_and_cluster_vars():
    res, inv = imported("inventory.ini")
    roles = {h.name: h.role for h in inv.hosts}
    assert roles == {"node1": "control-plane", "node2": "control-plane", "node3": "control-plane",
                     "node4": "worker", "node5": "worker"}
    assert inv.host("node1").address == "95.54.0.12"
    assert inv.host("node4").ssh.port == 2222 and inv.host("node1").ssh.port == 22
    assert inv.host("node5").ssh.user == "gpuadmin" and inv.host("node1").ssh.user == "ubuntu"
    assert inv.host("node1").ssh.identity_file == "~/.ssh/kubespray_ed25519"
    assert inv.cluster.cni == "flannel"
    assert inv.cluster.kubernetes_version == "1.34"
    # the become password is not imported, but sudo is then asked for one (from the environment)
    assert inv.ssh.sudo.mode == "password" and inv.ssh.sudo.password_env == "GPUK8S_SUDO_PASSWORD"


def test_ini_sample_reports_what_it_did_not_map_by_line():
    res, _ = imported("inventory.ini")
    lines = notes_by_line(res)
    assert "etcd_member_name" in lines[5] and "ip" in lines[5]
    assert "orphan" in lines[10]  # in [all] only: no role group
    assert lines[37] == ["ansible_become_password"]
    assert "upstream_dns_servers" in lines[40]
    assert lines[41] == ["http_proxy"]  # a Jinja expression: reported, never evaluated
    assert 7 not in lines  # node3's ip is behind an inline comment, as Ansible reads it
    jinja = next(n for n in res.notes if n.key == "http_proxy")
    assert "Jinja" in jinja.message
    secret = next(n for n in res.notes if n.key == "ansible_become_password")
    assert "password_env" in secret.message


def test_secrets_never_reach_the_output():
    for name, secret in (("inventory.ini", "Hunter2-not-for-the-output"), ("legacy.ini", "plain-text-password")):
        res, _ = imported(name)
        assert secret not in res.text
        assert secret not in json.dumps(res.to_json())


def test_yaml_sample_bastion_cidrs_rename_and_undefined_child():
    res, inv = imported("hosts.yaml")
    assert {h.name: h.role for h in inv.hosts} == {"node1": "control-plane", "node2": "worker",
                                                    "node3": "worker", "node-4": "worker"}
    b = inv.host("node3").ssh.bastion
    assert b is not None and (b.address, b.user, b.port) == ("jump.example.com", "ops", 2200)
    assert inv.host("node2").ssh.bastion is None
    assert inv.ssh.user == "deploy"
    assert (inv.cluster.pod_cidr, inv.cluster.service_cidr) == ("10.233.64.0/18", "10.233.0.0/18")
    lines = notes_by_line(res)
    assert lines[16] == ["ansible_ssh_common_args"]  # StrictHostKeyChecking=no is not carried over
    assert "accept-new" in next(n for n in res.notes if n.line == 16).message
    assert "Node_4" in lines[17]
    assert next(n for n in res.notes if n.key == "Node_4").kind == "changed"
    assert "node_labels" in lines[19]
    assert lines[42] == ["missing_group"]


def test_legacy_groups_host_ranges_and_bastion_group():
    res, inv = imported("legacy.ini")
    assert [h.name for h in inv.control_planes] == ["master-1"]
    assert [h.name for h in inv.workers] == ["gpu-01", "gpu-02", "gpu-03"]
    assert "bastion" not in [h.name for h in inv.hosts]  # the jump host is no node
    b = inv.ssh.bastion
    assert b is not None and (b.address, b.user, b.port) == ("203.0.113.5", "jump", 2022)
    assert inv.host("gpu-02").ssh.user == "ops"
    assert notes_by_line(res)[24] == ["ansible_ssh_pass"]
    # master-1 had no user: it inherits the common one, and that is said
    assert any(n.key == "master-1" and n.kind == "changed" for n in res.notes)


def test_proxyjump_and_per_host_key():
    _, inv = imported("proxyjump.yaml")
    assert inv.ssh.bastion is not None and inv.ssh.bastion.address == "bastion.example.com"
    assert inv.ssh.bastion.port == 2201 and inv.ssh.bastion.user == "ops"
    assert inv.host("w1").ssh.identity_file == "/keys/w1" and inv.host("cp1").ssh.identity_file is None


@pytest.mark.parametrize("args, want", [
    ("-o ProxyJump=ops@jump:2222", ("ops", "jump", 2222)),
    ("-J jump.example.com", (None, "jump.example.com", None)),
    ("-o 'ProxyCommand=ssh -W %h:%p -q -l ops -p 2200 jump'", ("ops", "jump", 2200)),
    ('-o ProxyCommand="ssh -W %h:%p admin@10.0.0.5"', ("admin", "10.0.0.5", None)),
    ("-o ProxyCommand='nc -X 5 -x proxy:1080 %h %p'", None),  # not an ssh jump: reported, not imported
])
def test_jump_hosts_of_ssh_args(args, want):
    jump, other = bastion_of_args(args)
    assert jump == want
    if want is None:
        assert other


def test_ini_dialect_details():
    inv = parse_ini("top ansible_host=10.0.0.1\n[g]\nh1:2200 a='x y' b=3 c\n[g:vars]\nk = [1, 2]\n[g:weird]\nz\n"
                    "[p:children]\ng\nnever\n")
    assert "top" in inv.groups["ungrouped"].hosts
    h1 = inv.hosts["h1"]
    assert h1.vars["ansible_port"].value == 2200 and h1.vars["a"].value == "x y" and h1.vars["b"].value == 3
    assert inv.groups["g"].vars["k"].value == [1, 2] and inv.groups["g"].vars["k"].line == 5
    keys = {(n.line, n.key) for n in inv.notes}
    assert (3, "c") in keys  # not key=value
    assert (6, "g:weird") in keys  # unknown section kind, its lines skipped
    assert "z" not in inv.hosts
    assert inv.groups["p"].children == {"g": 9, "never": 10}


def test_values_are_never_evaluated_and_hostile_values_stay_data(tmp_path):
    src = ("[kube_control_plane]\n"
           "cp1 ansible_host=10.0.0.1 ansible_ssh_private_key_file='/k\\nhosts: []'\n"
           "[kube_node]\n"
           "w1 ansible_host='{{ lookup(\"pipe\", \"touch /tmp/gpuk8s-pwned\") }}'\n"
           "w2 ansible_host=10.0.0.3 ansible_user='root; rm -rf /'\n"
           "w3 ansible_host='10.0.0.4 -oProxyCommand=x'\n"
           "w4 ansible_host=10.0.0.5 x=__import__('os').system('touch /tmp/gpuk8s-pwned')\n")
    res = convert(parse(src, "x.ini"))
    inv = loads(res.text, "out.yaml")
    assert [h.name for h in inv.hosts] == ["cp1", "w4"]
    assert inv.host("cp1").ssh.identity_file == "/k\\nhosts: []"
    assert not Path("/tmp/gpuk8s-pwned").exists()
    skipped = {n.key for n in res.notes if "not imported" in n.message}
    assert {"w1", "ansible_user", "ansible_host"} <= skipped


def test_no_control_plane_is_an_error():
    with pytest.raises(KubesprayImportError):
        convert(parse("[kube_node]\nw1 ansible_host=10.0.0.2\n", "x.ini"))


def test_cli_writes_validates_and_never_overwrites(tmp_path):
    out = tmp_path / "inv.yaml"
    r = CliRunner().invoke(app, ["inventory", "import", str(FIX / "inventory.ini"), "-o", str(out), "--json"])
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert data["ok"] and data["written"] == str(out)
    assert {n["line"] for n in data["not_imported"]} >= {5, 10, 37, 40, 41}
    loads(out.read_text(), str(out))
    before = out.read_text()
    r = CliRunner().invoke(app, ["inventory", "import", str(FIX / "hosts.yaml"), "-o", str(out)])
    assert r.exit_code == 2 and "not overwritten" in r.output
    assert out.read_text() == before
    r = CliRunner().invoke(app, ["inventory", "validate", "-i", str(out)])
    assert r.exit_code == 0, r.output


def test_cli_refuses_an_inventory_without_control_plane(tmp_path):
    src = tmp_path / "w.ini"
    src.write_text("[kube_node]\nw1\n")
    out = tmp_path / "inv.yaml"
    r = CliRunner().invoke(app, ["inventory", "import", str(src), "-o", str(out)])
    assert r.exit_code == 2 and "control plane" in r.output
    assert not out.exists()


def test_multi_range_patterns_are_bounded_by_their_product():
    # review finding 16: each range under the limit per range, too many hosts together: refused with the line
    res = convert(parse_ini("[kube_control_plane]\ncp1\n[kube_node]\nn[0:99][0:99]\ng[1:2][1:3]\n"))
    hosts = {h.name for h in res.hosts}
    assert hosts == {"cp1", "g11", "g12", "g13", "g21", "g22", "g23"}
    [note] = [n for n in res.notes if n.key == "n[0:99][0:99]"]
    assert note.line == 4 and "10000 hosts" in note.message
    # 10^8 hosts: refused at once, not expanded first (this took hours before)
    inv = parse_ini("[kube_node]\nn[0:99][0:99][0:99][0:99]\n")
    assert inv.hosts == {} and "100000000 hosts" in inv.notes[0].message and inv.notes[0].line == 2


def test_ssh_options_are_reported_by_name_only():
    # review finding 17: an option's value may be a secret (sshpass -p SECRET)
    _, other = bastion_of_args("-o ProxyCommand='sshpass -p S3CRET ssh -q gw' -o UserKnownHostsFile=/tmp/S3CRET "
                               "-oServerAliveInterval=S3CRET -C S3CRET -pS3CRET -o 'ProxyJump a@b,c@S3CRET'")
    assert other and not any("S3CRET" in o for o in other), other
    assert any("ProxyCommand" in o for o in other) and any("UserKnownHostsFile" in o for o in other)
    _, other = bastion_of_args("-o 'unbalanced S3CRET")
    assert other and not any("S3CRET" in o for o in other)
    text = ("[kube_control_plane]\ncp1 ansible_host=10.0.0.1 "
            "ansible_ssh_common_args=\"-o ProxyCommand='sshpass -p S3CRET ssh gw'\"\n")
    res = convert(parse_ini(text))
    assert not any("S3CRET" in n.message or "S3CRET" in n.key for n in res.notes)
    assert "S3CRET" not in json.dumps(res.to_json()) and "S3CRET" not in res.text


def test_a_yaml_entry_that_is_not_a_mapping_is_noted_by_line():
    text = ("all:\n  children:\n    kube_control_plane:\n      hosts:\n        cp1: {ansible_host: 10.0.0.1}\n"
            "    kube_node:\n      hosts: [w1, w2]\n      vars: 5\n    etcd:\n      children: x\n"
            "    calico_rr:\n      hosts:\n")
    a = parse(text, "inventory.yaml")
    got = {(n.line, n.key, n.message) for n in a.notes}
    assert (7, "kube_node.hosts", "hosts must be a mapping: not imported") in got
    assert (8, "kube_node.vars", "kube_node.vars must be a mapping: not imported") in got
    assert (10, "etcd.children", "children must be a mapping: not imported") in got
    assert not any(n.key.startswith("calico_rr") for n in a.notes)  # an empty hosts: nothing to say
