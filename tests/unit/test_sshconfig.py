"""The ssh config rules (gpuk8s/inventory/sshconfig.py): OpenSSH's first-match-wins, the inventory's explicit values
winning, ProxyJump chains, nothing executed, keywords not honoured reported with file:line."""

from __future__ import annotations

import dataclasses
import getpass
from pathlib import Path

import pytest

from gpuk8s.inventory import sshconfig
from gpuk8s.inventory.loader import InventoryError, loads
from gpuk8s.inventory.model import Bastion, SSHSettings


def write(tmp_path: Path, text: str, name: str = "config") -> str:
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def settings(cfg: str, **kw: object) -> SSHSettings:
    return dataclasses.replace(SSHSettings(config_file=cfg), explicit=frozenset(kw), **kw)  # type: ignore[arg-type]


def test_alias_takes_hostname_user_port_identity_first_match_wins(tmp_path: Path) -> None:
    key = tmp_path / "k1"
    key.write_text("x")
    cfg = write(tmp_path, f"""
Host gpu-01
    HostName 10.1.0.11
    IdentityFile {key}
Host gpu-*
    User ops
    Port 2222
    HostName 10.9.9.9
Host *
    User nobody
    Port 22
""")
    r = sshconfig.resolve("10.0.0.5", settings(cfg), alias="gpu-01")
    t = r.target
    assert (t.address, t.user, t.port) == ("10.1.0.11", "ops", 2222)  # first value obtained wins
    assert t.identity_files == (str(key),)
    assert t.allow_agent is True and t.look_for_keys is False  # OpenSSH: agent keys too, no default files
    assert t.via is None and r.notes == ()


def test_without_alias_the_address_is_looked_up_and_patterns_are_openssh_patterns(tmp_path: Path) -> None:
    cfg = write(tmp_path, """
Host 10.0.0.* !10.0.0.9
    User ops
Host [abc]
    User literal
Host GPU-A
    User upper
""")
    assert sshconfig.resolve("10.0.0.5", settings(cfg)).target.user == "ops"
    assert sshconfig.resolve("10.0.0.9", settings(cfg)).target.user == "root"  # negated: the default
    assert sshconfig.resolve("10.0.0.9", settings(cfg)).target.address == "10.0.0.9"
    assert sshconfig.resolve("x", settings(cfg), alias="a").target.user == "root"  # [..] is no set in OpenSSH
    assert sshconfig.resolve("x", settings(cfg), alias="[abc]").target.user == "literal"
    assert sshconfig.resolve("x", settings(cfg), alias="gpu-a").target.user == "upper"  # case-insensitive


def test_inventory_values_win_over_the_config(tmp_path: Path) -> None:
    cfg = write(tmp_path, "Host gpu\n  User ops\n  Port 2222\n  IdentityFile ~/.ssh/other\n"
                          "  UserKnownHostsFile /etc/other_known_hosts\n  ProxyJump jump\n")
    s = settings(cfg, user="ubuntu", port=22, identity_file="/keys/id", known_hosts="/kh",
                 bastion=Bastion("10.0.0.1", "ops"))
    r = sshconfig.resolve("10.0.0.5", s, alias="gpu")
    t = r.target
    assert (t.user, t.port, t.identity_files, t.allow_agent) == ("ubuntu", 22, ("/keys/id",), False)
    assert r.known_hosts == "/kh"
    assert t.via is not None and (t.via.address, t.via.user) == ("10.0.0.1", "ops")
    # not written in the inventory: the config's values
    r = sshconfig.resolve("10.0.0.5", settings(cfg), alias="gpu")
    assert (r.target.user, r.target.port, r.known_hosts) == ("ops", 2222, "/etc/other_known_hosts")
    assert r.target.via is not None and r.target.via.address == "jump"


def test_a_value_set_by_a_program_counts_as_explicit(tmp_path: Path) -> None:
    cfg = write(tmp_path, "Host *\n  User ops\n")
    s = dataclasses.replace(SSHSettings(config_file=cfg), user="admin")  # explicit left empty
    assert sshconfig.resolve("h", s).target.user == "admin"


def test_config_file_none_reads_nothing(tmp_path: Path) -> None:
    cfg = write(tmp_path, "Host * !jump\n  User ops\n  ProxyJump jump\n")
    r = sshconfig.resolve("10.0.0.5", settings("none"), alias="gpu")
    assert (r.target.address, r.target.user, r.target.via) == ("10.0.0.5", "root", None)
    r = sshconfig.resolve("10.0.0.5", settings(cfg))
    assert r.target.user == "ops" and r.target.via is not None and r.target.via.address == "jump"
    with pytest.raises(sshconfig.SSHConfigError, match="jumphost loop via jump"):
        sshconfig.resolve("10.0.0.5", settings(write(tmp_path, "Host *\n  ProxyJump jump\n", "loop")))


def test_no_identity_file_means_agent_and_default_keys(tmp_path: Path) -> None:
    cfg = write(tmp_path, "Host only\n  IdentitiesOnly yes\n  IdentityFile /missing/key\nHost noagent\n"
                          "  IdentityAgent none\n")
    t = sshconfig.resolve("h", settings(cfg)).target
    assert (t.identity_files, t.allow_agent, t.look_for_keys) == ((), True, True)
    t = sshconfig.resolve("h", settings(cfg), alias="only").target
    assert (t.identity_files, t.allow_agent, t.look_for_keys) == ((), False, False)  # missing file skipped
    t = sshconfig.resolve("h", settings(cfg), alias="noagent").target
    assert t.allow_agent is False


def test_proxyjump_one_hop_resolves_the_jump_host_in_the_config(tmp_path: Path) -> None:
    cfg = write(tmp_path, """
Host bastion
    HostName 192.0.2.1
    User jumper
    Port 2200
Host gpu-*
    ProxyJump bastion
""")
    t = sshconfig.resolve("10.0.0.5", settings(cfg), alias="gpu-1").target
    assert t.address == "gpu-1"  # no HostName: the name as typed, as OpenSSH
    j = t.via
    assert j is not None and (j.address, j.user, j.port, j.via) == ("192.0.2.1", "jumper", 2200, None)
    assert [h.address for h in t.chain()] == ["192.0.2.1", "gpu-1"]


def test_proxyjump_spec_user_and_port_win_and_default_user_is_the_local_one(tmp_path: Path) -> None:
    cfg = write(tmp_path, "Host j\n  User cfguser\n  Port 2200\nHost t\n  ProxyJump admin@j:2222\n"
                          "Host u\n  ProxyJump [2001:db8::1]:23\n")
    j = sshconfig.resolve("x", settings(cfg), alias="t").target.via
    assert j is not None and (j.user, j.port) == ("admin", 2222)
    j = sshconfig.resolve("x", settings(cfg), alias="u").target.via
    assert j is not None and (j.address, j.port, j.user) == ("2001:db8::1", 23, getpass.getuser())


def test_proxyjump_chain_as_ssh_dash_j(tmp_path: Path) -> None:
    cfg = write(tmp_path, """
Host a
    ProxyJump outer
Host b
    ProxyJump ignored
Host t
    ProxyJump a,b
""")
    t = sshconfig.resolve("x", settings(cfg), alias="t").target
    # b is reached through a (its own ProxyJump is not used); a through its own ProxyJump
    assert [h.address for h in t.chain()] == ["outer", "a", "b", "t"]


def test_proxyjump_loop_is_an_error_with_file_and_line(tmp_path: Path) -> None:
    cfg = write(tmp_path, "Host a\n  ProxyJump b\nHost b\n  ProxyJump a\n")
    with pytest.raises(sshconfig.SSHConfigError) as e:
        sshconfig.resolve("x", settings(cfg), alias="a")
    assert f"{cfg}:" in e.value.message and "jumphost loop via" in e.value.message


def test_proxyjump_none_and_proxycommand_whichever_first(tmp_path: Path) -> None:
    cfg = write(tmp_path, """
Host direct
    ProxyJump none
Host cmdfirst
    ProxyCommand nc -X connect %h %p
Host cmdfirst jumpfirst
    ProxyJump j
Host jumpfirst
    ProxyCommand touch /tmp/never
""")
    assert sshconfig.resolve("x", settings(cfg), alias="direct").target.via is None
    r = sshconfig.resolve("x", settings(cfg), alias="cmdfirst")
    assert r.target.via is None
    assert [(n.key, n.line) for n in r.notes] == [("ProxyCommand", 5)]
    assert "never runs" in r.notes[0].message and r.notes[0].file == cfg
    r = sshconfig.resolve("x", settings(cfg), alias="jumpfirst")
    assert r.target.via is not None and r.notes == ()  # OpenSSH ignores the later ProxyCommand


def test_match_exec_is_never_run_and_reported(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    cfg = write(tmp_path, f"Match exec \"touch {marker}\" host gpu\n  User fromexec\n"
                          "Match host gpu\n  Port 2022\nMatch tagged x\n  User tagged\n")
    r = sshconfig.resolve("x", settings(cfg), alias="gpu")
    assert not marker.exists()
    assert r.target.user == "root" and r.target.port == 2022  # the exec section never matches; others do
    assert [(n.key, n.line) for n in r.notes] == [("Match exec", 1), ("Match", 5)]


def test_include_expanded_and_section_restored(tmp_path: Path) -> None:
    d = tmp_path / "conf.d"
    d.mkdir()
    (d / "10-gpu").write_text("Host gpu-*\n  User inc\n  LocalCommand echo hi\n")
    cfg = write(tmp_path, f"Host gpu-1\n  Include {d}/*\n  Port 2222\nHost *\n  User last\n")
    r = sshconfig.resolve("x", settings(cfg), alias="gpu-1")
    assert (r.target.user, r.target.port) == ("inc", 2222)
    assert [(n.key, n.file, n.line) for n in r.notes] == [("LocalCommand", str(d / "10-gpu"), 3)]
    assert sshconfig.resolve("x", settings(cfg), alias="gpu-2").target.port == 22  # Port was gpu-1's only


def test_not_honoured_keywords_reported_only_for_hosts_they_apply_to(tmp_path: Path) -> None:
    cfg = write(tmp_path, "Host a\n  HostKeyAlias other\n  StrictHostKeyChecking no\nHost b\n"
                          "  StrictHostKeyChecking yes\n  CertificateFile ~/.ssh/id-cert.pub\n")
    assert {n.key for n in sshconfig.resolve("x", settings(cfg), alias="a").notes} == {
        "HostKeyAlias", "StrictHostKeyChecking"}
    assert {n.key for n in sshconfig.resolve("x", settings(cfg), alias="b").notes} == {"CertificateFile"}
    assert sshconfig.resolve("x", settings(cfg), alias="c").notes == ()


def test_not_honoured_keywords_are_reported_with_an_identity_file_in_the_inventory(tmp_path: Path) -> None:
    # issue 28 item 12: the report sat inside the identity lookup, which ssh.identity_file skips
    key = tmp_path / "id"
    key.write_text("x")
    cfg = write(tmp_path, "Host a\n  LocalCommand touch /tmp/x\n  KnownHostsCommand /bin/kh %H\n"
                          "  HostKeyAlias other\n  StrictHostKeyChecking no\n  IdentityFile ~/.ssh/other\n"
                          "Host jump\n  LocalCommand echo jump\nHost a\n  ProxyJump jump\n")
    want = [("LocalCommand", 2), ("KnownHostsCommand", 3), ("HostKeyAlias", 4), ("StrictHostKeyChecking", 5)]
    for s in (settings(cfg), settings(cfg, identity_file=str(key))):
        r = sshconfig.resolve("x", s, alias="a")
        assert [(n.key, n.line) for n in r.notes if n.line < 7] == want, s
        assert all(n.file == cfg for n in r.notes)
        assert ("LocalCommand", 8) in [(n.key, n.line) for n in r.notes]  # the jump host's, too
    explicit = sshconfig.resolve("x", settings(cfg, identity_file=str(key)), alias="a")
    assert explicit.target.identity_files == (str(key),) and not explicit.target.allow_agent
    # through the loader: warnings at file:line, as without identity_file
    inv = loads(inventory(cfg, f"    ssh: {{alias: a, identity_file: {key}}}"))
    assert [(w.file, w.line, w.key) for w in inv.warnings if w.line < 7] == [(cfg, line, k) for k, line in want]


def test_unparsable_line_names_file_and_line(tmp_path: Path) -> None:
    cfg = write(tmp_path, "Host a\n  User ops\n  justakeyword\n")
    with pytest.raises(sshconfig.SSHConfigError) as e:
        sshconfig.parse(cfg)
    assert e.value.line == 3 and f"{cfg}:3" in e.value.message


def inventory(cfg: str, host_ssh: str = "") -> str:
    return f"""
ssh:
  config_file: {cfg}
hosts:
  - name: cp-1
    address: 10.0.0.10
    role: control-plane
{host_ssh}
"""


def test_loader_reads_config_file_and_alias_and_reports_notes_as_warnings(tmp_path: Path) -> None:
    cfg = write(tmp_path, "Host gpu\n  User ops\n  ProxyCommand ssh -W %h:%p jump\n")
    inv = loads(inventory(cfg, "    ssh: {alias: gpu, port: 2200}"))
    h = inv.hosts[0]
    assert (h.ssh.alias, h.ssh.config_file) == ("gpu", cfg)
    assert {"alias", "port", "config_file"} <= h.ssh.explicit and "user" not in h.ssh.explicit
    [w] = inv.warnings
    assert (w.file, w.line, w.key, w.severity) == (cfg, 3, "ProxyCommand", "warning")
    r = sshconfig.resolve(h.address, h.ssh, h.ssh.alias)
    assert (r.target.user, r.target.port) == ("ops", 2200)


def test_loader_missing_config_file_and_bad_alias_are_errors(tmp_path: Path) -> None:
    with pytest.raises(InventoryError) as e:
        loads(inventory(str(tmp_path / "nope"), "    ssh: {alias: 'a b;c'}"))
    text = str(e.value)
    assert "does not exist" in text and "not a valid ssh alias" in text
    inv = loads(inventory("none"))
    assert inv.ssh.config_file == "none"


def test_loader_reports_config_syntax_error_at_its_line(tmp_path: Path) -> None:
    cfg = write(tmp_path, "Host *\n  ProxyJump bad@@host\n")
    with pytest.raises(InventoryError) as e:
        loads(inventory(cfg))
    [p] = e.value.problems
    assert (p.file, p.line) == (cfg, 2) and "ProxyJump" in p.message


def test_proxyjump_tokens_are_those_of_the_host(tmp_path: Path) -> None:
    cfg = write(tmp_path, "Host gpu-*\n  HostName 10.1.0.%n\n  ProxyJump jump-%r@bastion-%n:2%p\n  User ops\n")
    t = sshconfig.resolve("x", settings(cfg), alias="gpu-7").target
    assert t.via is not None and (t.via.user, t.via.address, t.via.port) == ("jump-ops", "bastion-gpu-7", 222)


def test_user_known_hosts_file_dev_null_or_unreadable_is_ignored_with_its_line(tmp_path: Path) -> None:
    # review finding 21: UserKnownHostsFile /dev/null with accept-new would trust any key on every run
    kh = tmp_path / "kh"
    kh.write_text("")
    cfg = write(tmp_path, f"Host a\n  UserKnownHostsFile /dev/null\nHost b\n  UserKnownHostsFile {tmp_path}\n"
                          f"Host c\n  UserKnownHostsFile {kh} /dev/null\n")
    mine = SSHSettings().known_hosts  # the inventory's (its default here: not written, so the file may win)
    for alias, line in (("a", 2), ("b", 4)):
        r = sshconfig.resolve("x", settings(cfg), alias=alias)
        assert r.known_hosts == mine
        [note] = [n for n in r.notes if n.key == "UserKnownHostsFile"]
        assert (note.file, note.line) == (cfg, line) and "ignored" in note.message
    r = sshconfig.resolve("x", settings(cfg), alias="c")  # a regular file is used, as before
    assert r.known_hosts == str(kh) and r.notes == ()
