"""containerd 2.x where the chosen minor needs it, config version 3, the toolkit's drop-in, cgroup v2 (issue 16).

Pure parts only: the facts parsers, the playbook context and rendering, the preflight verdicts, the inventory
keys. The lab runs the playbooks (tests/labtests/test_runtimes.py).
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from gpuk8s import versions
from gpuk8s.facts.model import ContainerdConfig, OSInfo
from gpuk8s.facts.parse import Section, parse_cgroup_version, parse_configd, parse_probe
from gpuk8s.inventory import loads
from gpuk8s.inventory.loader import InventoryError
from gpuk8s.inventory.model import Cluster
from gpuk8s.playbook.model import load_playbook
from gpuk8s.playbook.render import containerd_plan, context, render_playbook
from gpuk8s.playbook.script import build_script, parse_output
from gpuk8s.preflight.host_checks import check_host
from tests.unit.test_checks import CONTAINERD_2, CONTAINERD_17, HOST, TODAY, by_id, facts

ROOT = Path(__file__).resolve().parents[2]
ALINUX = OSInfo("alinux", ("rhel", "fedora", "centos", "anolis"), "3", "Alibaba Cloud Linux 3", "rhel")
PIN = versions.matrix().containerd_version


def inventory(minor: str, runtime: str = "containerd", extra: str = "") -> object:
    return loads(f"""
cluster: {{name: lab, kubernetes_version: "{minor}", container_runtime: {runtime}}}
ssh: {{user: gpuk8s, identity_file: /tmp/k, known_hosts: /tmp/kh}}
{extra}
hosts:
  - {{name: gpu-1, address: 10.0.0.2, gpus: 2}}
  - {{name: cp-1, address: 10.0.0.1, role: control-plane}}
""", "inv.yaml")


# --- facts -------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("out", "rc", "want"), [
    ("cgroup2fs", 0, 2), ("tmpfs\n", 0, 1), ("sysfs", 0, None), ("", 0, None),
    ("stat: cannot read file system information for '/sys/fs/cgroup/'", 1, None), ("stat: not found", 127, None),
])
def test_cgroup_version_from_stat(out, rc, want):
    assert parse_cgroup_version(Section(out, rc)) == want
    assert parse_cgroup_version(None) is None


def test_config_d_dropins_are_listed_and_nothing_else():
    sec = Section("/etc/containerd/config.d/99-nvidia.toml\n/etc/passwd\n/etc/containerd/config.d/x.conf\n"
                  "/etc/containerd/config.d/10-a.toml", 0)
    assert parse_configd(sec) == ("/etc/containerd/config.d/99-nvidia.toml", "/etc/containerd/config.d/10-a.toml")
    assert parse_configd(Section("", 0)) == () and parse_configd(None) == ()
    assert len(parse_configd(Section("\n".join(f"/etc/containerd/config.d/{i}.toml" for i in range(100)), 0))) == 32


def test_the_probe_reads_both_in_the_same_round_trip():
    probe = (ROOT / "gpuk8s" / "facts" / "probe.sh").read_text()
    assert "quick cgroupfs stat -fc %T /sys/fs/cgroup/" in probe and "quick containerd-configd configd" in probe
    text = ("@@gpuk8s-begin cgroupfs\ncgroup2fs\n@@gpuk8s-end cgroupfs 0\n"
            "@@gpuk8s-begin containerd-configd\n/etc/containerd/config.d/99-nvidia.toml\n"
            "@@gpuk8s-end containerd-configd 0\n")
    f = parse_probe(text)
    assert f.cgroup_version == 2 and f.containerd_configd == ("/etc/containerd/config.d/99-nvidia.toml",)
    assert f.to_json()["cgroup_version"] == 2


# --- what the containerd playbook does ------------------------------------------------------------------------------

@pytest.mark.parametrize(("minor", "have", "upgrade", "major"), [
    ("1.36", CONTAINERD_17, True, 2),   # Ubuntu 22.04's 1.7 below 1.36's floor: containerd.io 2.x
    ("1.37", CONTAINERD_17, True, 2),
    ("1.35", CONTAINERD_17, False, 1),  # the last minor on containerd 1.x: left as it is
    ("1.30", CONTAINERD_17, False, 1),
    ("1.36", CONTAINERD_2, False, 2),   # already 2.x
])
def test_containerd_plan(minor, have, upgrade, major):
    plan = containerd_plan(inventory(minor), facts(containerd=have))
    assert (plan["upgrade"], plan["major"]) == (upgrade, major)
    assert plan["config_version"] == (3 if major == 2 else 2)
    assert plan["cri_plugin"] == ("io.containerd.cri.v1.runtime" if major == 2 else "io.containerd.grpc.v1.cri")


def test_docker_hosts_get_no_containerd_upgrade():
    assert not containerd_plan(inventory("1.36", "docker"), facts(containerd=CONTAINERD_17))["upgrade"]


def steps(minor: str, f=None, extra: str = "") -> dict:
    inv = inventory(minor, extra=extra)
    host = inv.hosts[0]
    return {s.name: s for s in render_playbook(load_playbook("containerd"), context(inv, host, f or facts()))}


def test_an_upgrade_on_ubuntu_installs_containerd_io_from_dockers_apt_repository():
    s = steps("1.36", facts(containerd=CONTAINERD_17))
    assert {"containerd-apt-key", "containerd-apt-repo", "containerd-package-apt"} <= set(s)
    assert not {"containerd-yum-repo", "containerd-package-dnf"} & set(s)
    assert ("line='deb [signed-by=/usr/share/keyrings/gpuk8s-docker.gpg] https://download.docker.com/linux/ubuntu "
            "jammy stable'") in s["containerd-apt-repo"].run
    run = s["containerd-package-apt"].run
    assert f"spec='containerd.io={PIN}*'" in run and "--force-confold" in run
    assert run.rstrip().endswith('install --allow-downgrades "$spec"')
    assert run.startswith("gk_backup /etc/containerd/config.toml")
    assert s["containerd-package-apt"].restarts == "containerd"
    # the config must then be version 3 and every edit uses the version 3 plugin name
    assert "version[[:space:]]*=[[:space:]]*'3'" in s["containerd-config"].check
    assert "plugins.io.containerd.cri.v1.runtime.containerd.runtimes.runc.options" in s["systemd-cgroup"].check
    assert list(s).index("containerd-package-apt") < list(s).index("containerd-config")


def test_an_upgrade_on_alibaba_cloud_linux_uses_dockers_rhel_8_repository():
    s = steps("1.36", facts(os=ALINUX, containerd=CONTAINERD_17))
    assert "baseurl=https://download.docker.com/linux/rhel/8/$basearch/stable" in s["containerd-yum-repo"].file_content
    assert "gpgkey=https://download.docker.com/linux/rhel/gpg" in s["containerd-yum-repo"].file_content
    assert f"spec=containerd.io-{PIN.split('-')[0]}" in s["containerd-package-dnf"].run
    assert s["containerd-package-dnf"].run.rstrip().endswith('dnf install -y -q --allowerasing "$spec"')
    assert "containerd-apt-repo" not in s and "containerd-rpm-key" not in s


def test_without_an_upgrade_the_steps_are_those_of_containerd_1x_and_version_2():
    s = steps("1.35", facts(containerd=CONTAINERD_17))
    assert not [n for n in s if n.startswith(("containerd-apt", "containerd-yum", "containerd-package"))]
    assert "version[[:space:]]*=[[:space:]]*'2'" in s["containerd-config"].check
    assert "plugins.io.containerd.grpc.v1.cri.containerd.runtimes.runc.options" in s["systemd-cgroup"].check


def test_a_mirror_and_its_pinned_key_reach_the_steps_quoted():
    fp = "ABCDEF0123456789ABCDEF0123456789ABCDEF01"
    s = steps("1.36", facts(os=ALINUX, containerd=CONTAINERD_17),
              extra=f"install: {{containerd_repo: {{url: 'http://mirror.lan/docker', insecure_http: true, "
                    f"key_fingerprint: {fp}}}, containerd_version: 2.2.6-1}}")
    assert "baseurl=http://mirror.lan/docker/rhel/8/$basearch/stable" in s["containerd-yum-repo"].file_content
    assert "gpgkey=file:///etc/pki/rpm-gpg/gpuk8s-docker.asc" in s["containerd-yum-repo"].file_content
    key = s["containerd-rpm-key"].run
    assert "url=http://mirror.lan/docker/rhel/gpg" in key and f"pin={fp}" in key and "proto==http,https" in key


def test_toolkit_118_and_later_writes_the_drop_in_older_ones_edit_config_toml():
    new = steps("1.36")["nvidia-runtime"]
    assert versions.pins("1.36").toolkit.startswith("1.20")
    assert '--drop-in-config="$d"' in new.run and "f=/etc/containerd/conf.d/99-nvidia.toml" in new.run
    assert 'gk_backup "$f"' in new.run and 'mv -f "$d" "$f"' in new.run
    assert "conf.d/99-nvidia.toml" in new.title
    old = steps("1.30")["nvidia-runtime"]  # 1.30 keeps toolkit 1.17.8
    assert "--drop-in-config" not in old.run and 'nvidia-ctk runtime configure --runtime=containerd' in old.run
    # both ask containerd what it reads (config.toml merged with its imports), in either quoting
    for st in (new, old):
        assert st.check.startswith("gk_ctrd &&")
        assert "[\\\"']nvidia[\\\"']" in st.check
    # the rendered script is valid shell
    for st in steps("1.36").values():
        shlex.split(st.check.replace("\n", " "), comments=False) if st.check else None


def test_the_containerd_pin_is_written_only_in_the_matrix():
    pin = versions.matrix().containerd_version
    hits = [str(p.relative_to(ROOT)) for top in ("gpuk8s", "playbooks") for p in (ROOT / top).rglob("*")
            if p.is_file() and p.suffix in (".py", ".yaml", ".sh", ".j2", ".toml")
            and p.name != "versions.yaml" and pin in p.read_text(errors="replace")]
    assert hits == []
    assert f"  version: {pin}\n" in (ROOT / "gpuk8s" / "data" / "versions.yaml").read_text()


# --- preflight ----------------------------------------------------------------------------------------------------

def test_toolkit_118_0s_config_d_drop_in_is_named_with_its_fix():
    bad = facts(containerd_configd=("/etc/containerd/config.d/99-nvidia.toml",))
    r = by_id(check_host(HOST, bad, Cluster(kubernetes_version="1.36"), today=TODAY))["toolkit.dropin-path"]
    assert r.status == "warn" and r.severity == "warning"
    assert "nvidia-container-toolkit 1.18.0's drop-in is in /etc/containerd/config.d/" in r.message
    assert "/etc/containerd/config.d/99-nvidia.toml" in r.message and "issue 1404" in r.message
    assert r.remedy.startswith("gpuk8s install moves it to /var/lib/gpuk8s/backup")
    # an import of config.d/ alone is found too
    imp = facts(containerd_config=replace(facts().containerd_config, imports=("/etc/containerd/config.d/*.toml",)))
    assert by_id(check_host(HOST, imp, Cluster(), today=TODAY))["toolkit.dropin-path"].status == "warn"
    ok = by_id(check_host(HOST, facts(containerd_config=ContainerdConfig(
        True, (), "nvidia", True, True, ("/etc/containerd/conf.d/*.toml",))), Cluster(), today=TODAY))
    assert ok["toolkit.dropin-path"].status == "pass"
    # install fixes it: it never blocks preparation
    from gpuk8s.install.prepare import FIXED_BY_INSTALL
    assert "toolkit.dropin-path" in FIXED_BY_INSTALL


def test_cgroup_v1_fails_from_135_on():
    first = versions.matrix().cgroup_v2_from
    assert first == "1.35"
    for k in versions.matrix().minors.values():
        r = by_id(check_host(HOST, facts(cgroup_version=1), Cluster(kubernetes_version=k.minor), today=TODAY))
        c = r["k8s.cgroup-v2"]
        if k.number >= 35:
            assert c.status == "fail" and c.severity == "error", k.minor
            assert "kubelet is configured to not run on a host using cgroup v1" in c.message
            assert "systemd.unified_cgroup_hierarchy=1" in c.remedy
        else:
            assert c.status == "pass" and "cgroup v1" in c.message, k.minor
    assert by_id(check_host(HOST, facts(cgroup_version=2), Cluster(), today=TODAY))["k8s.cgroup-v2"].status == "pass"
    assert by_id(check_host(HOST, facts(cgroup_version=None), Cluster(), today=TODAY))["k8s.cgroup-v2"].status == "skip"


def test_a_disabled_version_3_cri_plugin_is_found():
    for name in ("io.containerd.cri.v1.runtime", "io.containerd.cri.v1.images", "cri"):
        f = facts(containerd_config=replace(facts().containerd_config, disabled_plugins=(name,)))
        assert by_id(check_host(HOST, f, Cluster(), today=TODAY))["runtime.cri-plugin"].status == "fail", name


def test_the_upgrade_verdict_does_not_block_install():
    from gpuk8s.install.prepare import blocking_checks
    r = check_host(HOST, facts(containerd=CONTAINERD_17), Cluster(kubernetes_version="1.36"), today=TODAY)
    assert by_id(r)["runtime.kubernetes-compat"].status == "warn"
    assert [c.id for c in blocking_checks(r)] == []


# --- inventory ----------------------------------------------------------------------------------------------------

def test_containerd_keys_default_to_the_matrix_and_refuse_plain_http_without_a_pinned_key():
    inv = inventory("1.36")
    assert inv.install.containerd_version == PIN
    assert inv.install.containerd_repo == "https://download.docker.com/linux"
    inv = inventory("1.36",
                    extra="install: {containerd_repo: 'https://mirror.lan/docker/', containerd_version: 2.1.5-1}")
    assert inv.install.containerd_repo == "https://mirror.lan/docker" and inv.install.containerd_version == "2.1.5-1"
    with pytest.raises(InventoryError) as e:
        inventory("1.36", extra="install: {containerd_repo: 'http://mirror.lan/docker'}")
    p = e.value.problems[0]
    assert p.key == "install.containerd_repo" and "plain http" in p.message and "key_fingerprint" in p.fix
    with pytest.raises(InventoryError) as e:
        inventory("1.36", extra="install: {containerd_version: '2.2; reboot'}")
    assert e.value.problems[0].key == "install.containerd_version"


# --- the steps run locally (review 2, group A): Debian's real containerd 1.6 judges the version 2 configs --------

REAL_CONTAINERD = shutil.which("containerd")
FAKES = ROOT / "tests" / "lab" / "fakes"
needs_containerd = pytest.mark.skipif(REAL_CONTAINERD is None, reason="no containerd binary here (apt: containerd)")


def run_local(tmp_path: Path, steps_: list, bins: dict[str, str]) -> tuple[dict[str, str], str]:
    """The generated script with /etc/containerd and /var/lib/gpuk8s under tmp_path and `bins` first on PATH:
    {step: status}, stdout."""
    b = tmp_path / "bin"
    b.mkdir(exist_ok=True)
    for name, body in bins.items():
        (b / name).write_text(body)
        (b / name).chmod(0o755)
    script = (build_script(steps_, owner="unit test", dry_run=False)
              .replace("/var/lib/gpuk8s", str(tmp_path / "state"))
              .replace("/etc/containerd", str(tmp_path / "etc/containerd"))
              .replace("export PATH=", f"export PATH={b}:"))
    p = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=120)
    res = parse_output(p.stdout)
    return {steps_[i].name: s.status for i, s in res.steps.items()}, p.stdout


def containerd_wrapper(tmp_path: Path) -> str:
    return f"#!/bin/sh\nexec {REAL_CONTAINERD} --config {tmp_path}/etc/containerd/config.toml \"$@\"\n"


def nvidia_ctk_model(toolkit: str = "1.20.0-1") -> str:
    """nvidia-ctk runtime configure as the lab models it (tests/lab/fakes/fake.py, from the toolkit's source:
    the drop-in gets a copy of config.toml's CRI runtime table)."""
    return (f"#!{sys.executable}\nimport sys\nsys.path.insert(0, {str(FAKES)!r})\nimport fake\n"
            f"class H:\n    state = {{'packages': {{'nvidia-container-toolkit-base': {toolkit!r}}}}}\n"
            "a = sys.argv[1:]\n"
            "opts = dict(x[2:].split('=', 1) for x in a[2:] if x.startswith('--') and '=' in x)\n"
            "sys.exit(fake._nvidia_ctk_containerd(H(), opts, '--set-as-default' in a))\n")


def dump_of(tmp_path: Path) -> str:
    p = subprocess.run([REAL_CONTAINERD or "containerd", "--config", str(tmp_path / "etc/containerd/config.toml"),
                        "config", "dump"], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    return p.stdout


def runc_systemd_cgroup(dump: str) -> str:
    """SystemdCgroup of the runc runtime in a containerd 1.x config dump."""
    import tomllib

    d = tomllib.loads(dump)
    return d["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]["runtimes"]["runc"]["options"]["SystemdCgroup"]


@needs_containerd
def test_an_edit_of_config_toml_after_the_toolkits_drop_in_reaches_containerd(tmp_path):
    """Finding 2: nvidia-ctk >= 1.18 copied config.toml's CRI table into its drop-in, which containerd 1.x puts in
    place of config.toml's table: SystemdCgroup = true written to config.toml afterwards changed nothing that
    containerd reads. The drop-in is rebuilt from config.toml until it is what nvidia-ctk makes of it."""
    assert versions.pins("1.35").toolkit.startswith("1.20")
    etc = tmp_path / "etc/containerd"
    etc.mkdir(parents=True)
    (etc / "config.toml").write_text('version = 2\n\n[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc'
                                     '.options]\n  SystemdCgroup = false\n')
    bins = {"containerd": containerd_wrapper(tmp_path), "nvidia-ctk": nvidia_ctk_model()}
    # someone ran `nvidia-ctk runtime configure` while SystemdCgroup was false
    run_local(tmp_path, [], bins)  # writes the bins
    p = subprocess.run([str(tmp_path / "bin/nvidia-ctk"), "runtime", "configure", "--runtime=containerd",
                        "--set-as-default", f"--config={etc}/config.toml",
                        f"--drop-in-config={etc}/conf.d/99-nvidia.toml"], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert runc_systemd_cgroup(dump_of(tmp_path)) is False
    s = steps("1.35", facts(containerd=CONTAINERD_17))
    todo = [s["systemd-cgroup"], s["nvidia-runtime"]]
    status, out = run_local(tmp_path, todo, bins)
    assert status == {"systemd-cgroup": "changed", "nvidia-runtime": "changed"}, out
    dump = dump_of(tmp_path)
    assert runc_systemd_cgroup(dump) is True, dump
    assert 'default_runtime_name = "nvidia"' in dump and "/usr/bin/nvidia-container-runtime" in dump
    # converged: nothing to do on the next run
    status, out = run_local(tmp_path, todo, bins)
    assert status == {"systemd-cgroup": "unchanged", "nvidia-runtime": "unchanged"}, out
    # a later edit of config.toml's CRI table (as a user's hand edit makes) makes the drop-in stale again
    cfg = (etc / "config.toml").read_text()
    (etc / "config.toml").write_text(cfg + '\n[plugins."io.containerd.grpc.v1.cri".registry]\n'
                                           '  config_path = "/etc/containerd/certs.d"\n')
    assert 'config_path = ""' in dump_of(tmp_path)  # containerd 1.x: the drop-in's CRI table wins
    status, out = run_local(tmp_path, [s["nvidia-runtime"]], bins)
    assert status == {"nvidia-runtime": "changed"}, out
    assert 'config_path = "/etc/containerd/certs.d"' in dump_of(tmp_path)


@needs_containerd
def test_a_cri_plugin_disabled_in_an_array_over_several_lines_is_found_and_enabled(tmp_path):
    """Finding 17: disabled_plugins = [ on one line and "io.containerd.grpc.v1.cri" on the next passed the check."""
    etc = tmp_path / "etc/containerd"
    etc.mkdir(parents=True)
    (etc / "config.toml").write_text('version = 2\ndisabled_plugins = [\n  "io.containerd.grpc.v1.cri",  # CRI\n'
                                     '  "io.containerd.internal.v1.opt",\n]\n')
    step = steps("1.35", facts(containerd=CONTAINERD_17))["cri-plugin-enabled"]
    bins = {"containerd": containerd_wrapper(tmp_path)}
    status, out = run_local(tmp_path, [step], bins)
    assert status == {"cri-plugin-enabled": "changed"}, out
    dump = dump_of(tmp_path)
    assert 'disabled_plugins = ["io.containerd.internal.v1.opt"]' in dump, dump
    assert run_local(tmp_path, [step], bins)[0] == {"cri-plugin-enabled": "unchanged"}


def test_a_containerd_version_without_a_revision_converges(tmp_path):
    """Finding 6: install.containerd_version 2.2.6 installed 2.2.6-1~ubuntu.22.04~jammy, which the check refused."""
    pin = PIN.split("-")[0]
    major, minor_, patch = pin.split(".")
    step = steps("1.36", facts(containerd=CONTAINERD_17),
                 extra=f"install: {{containerd_version: {pin}}}")["containerd-package-apt"]

    def check(installed: str) -> bool:
        b = tmp_path / "bin"
        b.mkdir(exist_ok=True)
        (b / "dpkg-query").write_text(f"#!/bin/sh\necho '{installed}'\n")
        (b / "dpkg-query").chmod(0o755)
        return subprocess.run(["sh", "-c", step.check], env={"PATH": f"{b}:/usr/bin:/bin"}).returncode == 0

    assert check(f"{pin}-1~ubuntu.22.04~jammy") and check(pin) and check(f"{pin}~rc1")
    assert not check(f"{major}.{minor_}.{patch}0-1~ubuntu.22.04~jammy")  # 2.2.60 is not 2.2.6
    assert not check(f"{major}.{minor_}.{int(patch) + 1}-1~ubuntu.22.04~jammy")


@pytest.mark.parametrize(("os_info", "upgrade"), [
    (OSInfo("ubuntu", ("debian",), "22.04", "Ubuntu 22.04", "debian"), True),
    (ALINUX, True),
    (OSInfo("debian", (), "12", "Debian GNU/Linux 12 (bookworm)", "debian"), False),
    (OSInfo("ubuntu", ("debian",), "24.04", "Ubuntu 24.04", "debian"), False),
    (OSInfo("rhel", ("fedora",), "9.4", "Red Hat Enterprise Linux 9.4", "rhel"), False),
])
def test_the_containerd_upgrade_is_made_only_where_preflight_promises_it(os_info, upgrade):
    """Finding 14: on an OS that preflight does not upgrade (its failure --ignore'd), no jammy or el8 packages."""
    f = facts(os=os_info, containerd=CONTAINERD_17)
    assert containerd_plan(inventory("1.36"), f)["upgrade"] is upgrade
    names = set(steps("1.36", f))
    assert bool(names & {"containerd-apt-repo", "containerd-yum-repo"}) is upgrade
    verdict = by_id(check_host(HOST, f, Cluster(kubernetes_version="1.36"), today=TODAY))["runtime.kubernetes-compat"]
    assert verdict.status == ("warn" if upgrade else "fail")


def test_a_replaced_config_is_kept_dated_where_the_backup_holds_an_older_one(tmp_path):
    """Finding 3: the upgrade to containerd 2.x replaces the version 2 config.toml that gpuk8s prepared and
    someone edited since; /var/lib/gpuk8s/backup holds only the file from before gpuk8s's first change."""
    etc = tmp_path / "etc/containerd"
    etc.mkdir(parents=True)
    backup = tmp_path / f"state/backup{etc}/config.toml"
    backup.parent.mkdir(parents=True)
    backup.write_text("# the original, from before gpuk8s\n")
    (etc / "config.toml").write_text('version = 2\n# edited by hand since\n')
    (etc / "config.toml").chmod(0o600)
    step = steps("1.36", facts(containerd=CONTAINERD_17))["containerd-config"]
    # containerd 2.x: its default is version 3; its dump reads the file
    fake = f"#!/bin/sh\ncase \"$*\" in 'config default') echo 'version = 3';; *) cat {etc}/config.toml;; esac\n"
    status, out = run_local(tmp_path, [step], {"containerd": fake})
    assert status == {"containerd-config": "changed"}, out
    [kept] = list(etc.glob("config.toml.gpuk8s-*"))
    assert kept.read_text() == 'version = 2\n# edited by hand since\n' and oct(kept.stat().st_mode & 0o777) == "0o600"
    assert f"kept the previous {etc}/config.toml as {kept}" in out
    assert (etc / "config.toml").read_text() == "version = 3\n"
    assert backup.read_text() == "# the original, from before gpuk8s\n"
    # the file is the one the backup holds: no second copy
    (etc / "config.toml").write_text(backup.read_text())
    kept.unlink()
    assert run_local(tmp_path, [step], {"containerd": fake})[0] == {"containerd-config": "changed"}
    assert not list(etc.glob("config.toml.gpuk8s-*"))


def test_a_hung_driver_costs_the_probe_one_nvidia_smi_timeout_not_five(tmp_path):
    """Finding 15: each later nvidia-smi section waited its own 20 s after the first timed out; the probe as a
    whole is cut off at 120 s and every fact is lost. `timeout` passes on the exit status 124 of a call it cut."""
    b = tmp_path / "bin"
    b.mkdir()
    log = tmp_path / "calls"
    probe = (ROOT / "gpuk8s" / "facts" / "probe.sh").read_text().replace("export PATH=", f"export PATH={b}:")

    def run(rc: int, out: str) -> tuple[object, list[str]]:
        log.write_text("")
        (b / "nvidia-smi").write_text(f"#!/bin/sh\necho \"$*\" >> {log}\nprintf '%s\\n' '{out}'\nexit {rc}\n")
        (b / "nvidia-smi").chmod(0o755)
        p = subprocess.run(["sh", "-c", probe], capture_output=True, text=True, timeout=120)
        return parse_probe(p.stdout), log.read_text().splitlines()

    f, calls = run(124, "")
    assert len(calls) == 1 and calls[0].startswith("--query-gpu=index,name")
    assert f.gpu.state == "failed" and "exit status 124" in f.gpu.error
    assert f.mig.state == "failed" and "timed out" in f.mig.error and f.compute_caps == ()
    # a driver that answers is asked everything, as before
    f, calls = run(0, "0, NVIDIA A100-SXM4-80GB, GPU-1, 580.65.06, 81920, Disabled")
    assert len(calls) >= 4 and f.gpu.state == "ok"


APT_CACHE = shutil.which("apt-cache")
# docker.list as Docker's install guide for Ubuntu writes it (docs.docker.com/engine/install/ubuntu, 2024: its own
# keyring /etc/apt/keyrings/docker.asc), and the same source as a deb822 stanza
DOCKER_GUIDE = {
    "docker.list": "deb [arch=amd64 signed-by=/etc/apt/keyrings/docker.asc] https://download.docker.com/linux/ubuntu "
                   "jammy stable\n",
    "docker.sources": "Types: deb\nURIs: https://download.docker.com/linux/ubuntu\nSuites: jammy\n"
                      "Components: stable\nSigned-By: /etc/apt/keyrings/docker.asc\n",
}


def apt_reads(etc_apt: Path) -> str:
    """apt's own verdict on the sources under etc_apt ("" when it reads them)."""
    lists = etc_apt.parent / "lists"
    (lists / "partial").mkdir(parents=True, exist_ok=True)
    p = subprocess.run([APT_CACHE or "apt-cache", "-o", f"Dir::Etc::SourceList={etc_apt}/sources.list",
                        "-o", f"Dir::Etc::SourceParts={etc_apt}/sources.list.d", "-o", f"Dir::State::Lists={lists}",
                        "policy"], capture_output=True, text=True)
    return "\n".join(ln for ln in (p.stdout + p.stderr).splitlines() if ln.startswith("E:"))


@pytest.mark.skipif(APT_CACHE is None, reason="apt's own Signed-By conflict check needs apt-cache (Debian or Ubuntu; "
                    ".ci/run's machine has it): not on this machine")
@pytest.mark.parametrize("existing", [None, "docker.list", "docker.sources"])
def test_an_existing_docker_apt_source_is_used_not_duplicated(tmp_path, existing):
    """Finding 4: a second entry for Docker's repository with another signed-by stops apt for good; apt's real
    message is checked here (Debian's apt reads the same sources)."""
    etc_apt = tmp_path / "etc/apt"
    (etc_apt / "sources.list.d").mkdir(parents=True)
    (etc_apt / "sources.list").write_text("")
    if existing:
        (etc_apt / "sources.list.d" / existing).write_text(DOCKER_GUIDE[existing])
        # what the step prevents: apt refuses the sources
        (etc_apt / "sources.list.d/x.list").write_text(
            "deb [signed-by=/usr/share/keyrings/gpuk8s-docker.gpg] https://download.docker.com/linux/ubuntu jammy "
            "stable\n")
        assert "E: Conflicting values set for option Signed-By regarding source " \
               "https://download.docker.com/linux/ubuntu/ jammy" in apt_reads(etc_apt)
        (etc_apt / "sources.list.d/x.list").unlink()
    step = steps("1.36", facts(containerd=CONTAINERD_17))["containerd-apt-repo"]
    step = replace(step, check=step.check.replace("/etc/apt", str(etc_apt)), run=step.run.replace("/etc/apt",
                                                                                                   str(etc_apt)))
    status, out = run_local(tmp_path, [step], {})
    assert status == {"containerd-apt-repo": "changed"}, out
    ours = etc_apt / "sources.list.d/gpuk8s-docker.list"
    assert apt_reads(etc_apt) == ""
    assert ours.exists() is (existing is None)
    if existing:
        assert f"using the existing source of https://download.docker.com/linux/ubuntu jammy in: " \
               f"{etc_apt}/sources.list.d/{existing}" in out
        # ours is noted as gpuk8s's in the backup (reset --purge keeps the containerd.io that gpuk8s installed)
        assert (tmp_path / f"state/backup{ours}.absent").exists()
    assert run_local(tmp_path, [step], {})[0] == {"containerd-apt-repo": "unchanged"}
    if existing:  # ours, written by an earlier run before the guide's source was added, is removed
        ours.write_text("deb [signed-by=/usr/share/keyrings/gpuk8s-docker.gpg] https://download.docker.com/linux/"
                        "ubuntu jammy stable\n")
        assert apt_reads(etc_apt) != ""
        assert run_local(tmp_path, [step], {})[0] == {"containerd-apt-repo": "changed"}
        assert not ours.exists() and apt_reads(etc_apt) == ""


# apt-get -s prints one "Remv NAME [VERSION]" line per package it would remove; dnf prints the transaction table
# (dnf/cli/output.py: "Removing dependent packages:", rows indented by one space, "replacing" rows by five; this
# layout is that of a real docker-ce install on el8 that removed buildah, cockpit-podman and podman)
APT_SIMULATION = """NOTE: This is only a simulation!
Reading package lists...
Remv containerd [1.7.12-0ubuntu2~22.04.1]
Remv runc [1.1.12-0ubuntu2~22.04.1]
Remv docker.io [24.0.7-0ubuntu2~22.04.1]
Inst containerd.io (2.2.6-1~ubuntu.22.04~jammy Docker CE:jammy [amd64])
Conf containerd.io (2.2.6-1~ubuntu.22.04~jammy Docker CE:jammy [amd64])
"""
DNF_TRANSACTION = """Dependencies resolved.
================================================================================
 Package          Architecture  Version                      Repository    Size
================================================================================
Installing:
 containerd.io    x86_64        2.2.6-3.1.el8                gpuk8s-docker 33 M
     replacing  runc.x86_64 1.1.12-1.module+el8.9.0+21243+a586538b
Removing dependent packages:
 buildah          x86_64        1:1.31.3-1.module+el8.9.0+19761+326da906  @AppStream  29 M
 podman           x86_64        3:4.6.1-4.module+el8.9.0+19761+326da906   @AppStream  54 M

Transaction Summary
================================================================================
Install  1 Package
Remove   2 Packages

Operation aborted.
"""


@pytest.mark.parametrize("family", ["debian", "rhel"])
@pytest.mark.parametrize("others", [True, False])
def test_installing_containerd_io_never_removes_docker_or_podman_silently(tmp_path, family, others):
    """Finding 5: containerd.io replaces containerd and runc; apt-get -y removed docker.io with them and
    dnf --allowerasing removed podman and buildah. Asked first; refused naming them, before any change."""
    f = facts(containerd=CONTAINERD_17) if family == "debian" else facts(os=ALINUX, containerd=CONTAINERD_17)
    step = steps("1.36", f)["containerd-package-apt" if family == "debian" else "containerd-package-dnf"]
    log, done = tmp_path / "calls", tmp_path / "installed"
    pin = PIN if family == "debian" else PIN.split("-")[0]
    if family == "debian":
        sim = APT_SIMULATION if others else APT_SIMULATION.replace("Remv docker.io [24.0.7-0ubuntu2~22.04.1]\n", "")
        bins = {"apt-get": f"#!/bin/sh\necho \"$*\" >> {log}\ncase \" $* \" in *' -s '*) cat <<'E'\n{sim}E\n"
                           f";; *' install '*) echo '{pin}~ubuntu.22.04~jammy' > {done};; esac\n",
                "dpkg-query": f"#!/bin/sh\ncat {done} 2>/dev/null || exit 1\n"}
    else:
        table = DNF_TRANSACTION if others else DNF_TRANSACTION.replace(
            "Removing dependent packages:\n buildah          x86_64        1:1.31.3-1.module+el8.9.0+19761+326da906  "
            "@AppStream  29 M\n podman           x86_64        3:4.6.1-4.module+el8.9.0+19761+326da906   "
            "@AppStream  54 M\n", "")
        assert ("Removing" in table) is others
        bins = {"dnf": f"#!/bin/sh\necho \"$*\" >> {log}\ncase \" $* \" in *' --assumeno '*) cat <<'E'\n{table}E\n"
                       f"exit 1;; *) echo '{pin}' > {done};; esac\n",
                "rpm": f"#!/bin/sh\ncat {done} 2>/dev/null | tr -d '\\n' || exit 1\n"}
    status, out = run_local(tmp_path, [step], bins)
    calls = log.read_text().splitlines()
    if others:
        assert status == {step.name: "failed"}, out
        gone = "docker.io" if family == "debian" else "buildah podman"
        assert f"would remove {gone}: it needs containerd or runc, which containerd.io replaces" in out
        assert not done.exists() and not [c for c in calls if " -y " in f" {c} "]  # nothing was installed
    else:
        assert status == {step.name: "changed"}, out
        assert done.exists() and any(" -y " in f" {c} " for c in calls)
