"""Playbooks without SSH: the shipped files parse and render for every OS/runtime, values are quoted,
the generated script is valid sh and actually converges when run (locally, in a scratch root)."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuk8s.facts.model import OSInfo
from gpuk8s.inventory.loader import loads
from gpuk8s.inventory.model import InstallSettings
from gpuk8s.playbook.model import PlaybookError, load_playbook, parse_playbook, playbook_names
from gpuk8s.playbook.render import RenderedStep, context, render_playbook
from gpuk8s.playbook.script import build_script, lines_that_matter, parse_output
from tests.unit.test_checks import HOST, facts

INV = loads("hosts:\n  - {name: cp-1, address: 10.0.0.10, role: control-plane}\n"
            "  - {name: gpu-1, address: 10.0.0.11, role: worker, gpus: 8}\n")
ALINUX = OSInfo("alinux", ("rhel", "fedora", "centos", "anolis"), "3", "Alibaba Cloud Linux 3", "rhel")


def steps_for(inv=INV, f=None, host=HOST) -> list[RenderedStep]:
    ctx = context(inv, host, f or facts())
    from gpuk8s.install.prepare import playbooks_for

    return [s for name in playbooks_for(inv) for s in render_playbook(load_playbook(name), ctx)]


def test_shipped_playbooks_parse():
    assert playbook_names() == ["containerd", "docker", "kubernetes-prerequisites", "nvidia-container-toolkit"]
    for name in playbook_names():
        pb = load_playbook(name)
        assert pb.steps and pb.description


@pytest.mark.parametrize("os_info", [None, ALINUX], ids=["ubuntu", "alinux"])
@pytest.mark.parametrize("runtime", ["containerd", "docker"])
@pytest.mark.parametrize("gpus", [0, 8])
def test_every_combination_renders_to_valid_sh(os_info, runtime, gpus, tmp_path):
    inv = replace(INV, cluster=replace(INV.cluster, container_runtime=runtime))
    f = facts() if os_info is None else facts(os=os_info)
    if not gpus:
        f = replace(f, gpu=replace(f.gpu, gpus=()))
    host = replace(HOST, gpus=gpus or None)
    steps = steps_for(inv, f, host)
    names = [s.name for s in steps]
    assert len(names) == len(set(names))
    assert ("toolkit-packages-apt" in names) == (gpus > 0 and os_info is None)
    assert ("toolkit-packages-dnf" in names) == (gpus > 0 and os_info is not None)
    assert ("nvidia-runtime" in names) == (gpus > 0 and runtime == "containerd")
    for shell in ("sh", "bash") if shutil.which("bash") else ("sh",):
        for dry in (False, True):
            script = tmp_path / "s.sh"
            script.write_text(build_script(steps, owner="test", dry_run=dry))
            p = subprocess.run([shell, "-n", str(script)], capture_output=True, text=True)
            assert p.returncode == 0, p.stderr


def test_inventory_values_are_quoted_in_commands():
    hostile = "1.17.8-1; touch /tmp/pwned"
    inv = replace(INV, install=InstallSettings(toolkit_version=hostile, toolkit_repo="https://x/$(reboot)"))
    run = {s.name: s for s in steps_for(inv)}["toolkit-packages-apt"]
    assert "v='1.17.8-1; touch /tmp/pwned'" in run.run
    key = {s.name: s for s in steps_for(inv)}["toolkit-apt-key"]
    assert "'https://x/$(reboot)/gpgkey'" in key.run


def test_the_loader_rejects_shell_in_repository_settings():
    from gpuk8s.inventory.loader import InventoryError

    base = "hosts:\n  - {name: cp-1, address: 10.0.0.10, role: control-plane}\n"
    for bad in ('toolkit_repo: "https://x/`id`"', 'toolkit_version: "1.0; reboot"',
                'kubernetes_repo: "https://x/ y"', "toolkit_repo: ftp://mirror"):
        with pytest.raises(InventoryError) as e:
            loads(base + "install:\n  " + bad + "\n")
        assert "install." in str(e.value)
    ok = loads(base + "install:\n  toolkit_repo: https://mirror.example.com:8443/nvidia/\n"
               "  toolkit_version: 1.17.3-1\n")
    assert ok.install.toolkit_repo == "https://mirror.example.com:8443/nvidia"


def test_playbook_format_errors_name_the_step():
    with pytest.raises(PlaybookError, match="step 1.*needs both 'check' and 'run'"):
        parse_playbook("name: x\nsteps:\n  - name: a\n    check: 'true'\n", "x.yaml")
    with pytest.raises(PlaybookError, match="unknown keys"):
        parse_playbook("name: x\nsteps:\n  - {name: a, check: 'true', run: 'true', sudo: yes}\n", "x.yaml")
    with pytest.raises(PlaybookError, match="must be unique"):
        parse_playbook("name: x\nsteps:\n  - {name: a, check: a, run: b}\n  - {name: a, check: a, run: b}\n", "x")
    with pytest.raises(PlaybookError, match="not valid YAML"):
        parse_playbook("steps: [", "x.yaml")


def test_parse_output_reads_steps_outputs_and_lock():
    text = ("@@gpuk8s-lock stale gpuk8s on a (pid 9), since t\n@@gpuk8s-step 0 unchanged 0\n"
            "@@gpuk8s-out 1\nE: Could not get lock\nsecond line\n@@gpuk8s-out-end 1\n@@gpuk8s-step 1 failed 100\n")
    res = parse_output(text)
    assert res.lock.startswith("stale gpuk8s on a") and not res.finished
    assert res.steps[0].status == "unchanged"
    assert (res.steps[1].status, res.steps[1].exit_status) == ("failed", 100)
    assert res.steps[1].output == "E: Could not get lock\nsecond line"
    assert lines_that_matter(res.steps[1].output) == ["E: Could not get lock"]
    assert lines_that_matter("a\nb\nc") == ["a", "b", "c"]


@given(st.text())
def test_parse_output_never_raises(text):
    parse_output(text)


def test_script_converges_locally_and_is_idempotent(tmp_path):
    """The generated script, run by sh on this machine against files under tmp_path: a file step writes
    atomically with a backup note, a command step runs once, a failing step stops the script."""
    root = tmp_path
    pb = parse_playbook(f"""
name: t
steps:
  - name: conf
    file: {{path: {root}/etc/app.conf, content: "a = 1\\n", mode: "0600"}}
  - name: marker
    check: test -e {root}/marker
    run: echo ran >> {root}/runs && touch {root}/marker
  - name: edit
    check: grep -q 'b = 2' {root}/etc/other.conf
    run: |
      [ -e {root}/etc/other.conf ] || echo 'b = 1' > {root}/etc/other.conf
      gk_edit {root}/etc/other.conf -e 's/b = 1/b = 2/'
""", "t.yaml")
    steps = render_playbook(pb, {})
    script = build_script(steps, owner="unit test", dry_run=False).replace("/var/lib/gpuk8s", str(root / "state"))

    def run() -> str:
        p = subprocess.run(["sh", "-c", script], capture_output=True, text=True)
        assert p.returncode == 0, p.stdout + p.stderr
        return p.stdout

    first = parse_output(run())
    assert [s.status for s in first.steps.values()] == ["changed", "changed", "changed"] and first.finished
    assert (root / "etc/app.conf").read_text() == "a = 1\n"
    assert (root / "etc/other.conf").read_text() == "b = 2\n"
    assert (root / f"state/backup{root}/etc/other.conf").read_text() == "b = 1\n"
    assert oct((root / "etc/app.conf").stat().st_mode & 0o777) == "0o600"
    assert (root / f"state/backup{root}/etc/app.conf.absent").exists()
    second = parse_output(run())
    assert [s.status for s in second.steps.values()] == ["unchanged"] * 3
    assert (root / "runs").read_text() == "ran\n"
    assert not list((root / "etc").glob(".gpuk8s.*"))
    assert not (root / "state/lock.owner").exists()

    bad = parse_playbook(f"name: t\nsteps:\n  - {{name: fail, check: 'false', run: 'echo E: broken >&2; exit 7'}}\n"
                         f"  - {{name: after, check: 'false', run: 'touch {root}/after'}}\n", "t.yaml")
    script = build_script(render_playbook(bad, {}), owner="u", dry_run=False).replace(
        "/var/lib/gpuk8s", str(root / "state"))
    p = subprocess.run(["sh", "-c", script], capture_output=True, text=True)
    res = parse_output(p.stdout)
    assert p.returncode == 1 and res.steps[0].status == "failed" and res.steps[0].exit_status == 7
    assert "E: broken" in res.steps[0].output and 1 not in res.steps and not Path(root / "after").exists()
