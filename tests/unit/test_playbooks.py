"""Playbooks without SSH: the shipped files parse and render for every OS/runtime, values are quoted,
the generated script is valid sh and actually converges when run (locally, in a scratch root)."""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuk8s.facts.model import OSInfo
from gpuk8s.inventory.loader import loads
from gpuk8s.inventory.model import InstallSettings, Inventory
from gpuk8s.lines import lines_that_matter
from gpuk8s.playbook.model import PlaybookError, load_playbook, parse_playbook, playbook_names
from gpuk8s.playbook.render import RenderedStep, context, render_playbook
from gpuk8s.playbook.script import build_script, parse_output
from tests.unit.test_checks import HOST, facts

INV = loads("hosts:\n  - {name: cp-1, address: 10.0.0.10, role: control-plane}\n"
            "  - {name: gpu-1, address: 10.0.0.11, role: worker, gpus: 8}\n")
ALINUX = OSInfo("alinux", ("rhel", "fedora", "centos", "anolis"), "3", "Alibaba Cloud Linux 3", "rhel")


def steps_for(inv=INV, f=None, host=HOST) -> list[RenderedStep]:
    ctx = context(inv, host, f or facts())
    from gpuk8s.install.prepare import playbooks_for

    return [s for name in playbooks_for(inv) for s in render_playbook(load_playbook(name), ctx)]


def test_shipped_playbooks_parse():
    assert playbook_names() == ["containerd", "cri-dockerd", "docker", "kubernetes-prerequisites",
                              "nvidia-container-toolkit", "nvidia-driver", "rdma"]
    for name in playbook_names():
        pb = load_playbook(name)
        assert pb.steps and pb.description


FABRIC_INV = "  - {name: gpu-2, address: 10.0.0.12, gpus: 8, fabric: {link_layer: infiniband, gpudirect: GD}}\n"


@pytest.mark.parametrize("gd, flavor, peermem", [("peermem", "proprietary", True), ("auto", "open", False),
                                                  ("auto", "proprietary", False), ("off", "open", False)])
def test_the_rdma_playbook_runs_on_fabric_nodes_only(gd, flavor, peermem) -> None:
    """rdma.yaml: the distribution's RDMA packages and the verbs modules on a node whose inventory sets fabric:;
    nvidia-peermem only where gpudirect says peermem (auto takes dma-buf, which needs no module, or none)."""
    inv = loads("hosts:\n  - {name: cp-1, address: 10.0.0.10, role: control-plane}\n"
                + FABRIC_INV.replace("GD", gd))
    host = inv.host("gpu-2")
    f = facts(driver=replace(facts().driver, module_flavor=flavor))
    steps = {s.name: s for s in steps_for(inv, f, host)}
    assert {"rdma-packages-apt", "rdma-modules-at-boot", "rdma-modules-loaded"} <= set(steps)
    assert "rdma-packages-dnf" not in steps
    assert ("peermem-loaded" in steps) == peermem
    boot = steps["rdma-modules-at-boot"]
    assert boot.file_path == "/etc/modules-load.d/gpuk8s-rdma.conf"
    assert [ln for ln in boot.file_content.splitlines() if ln and not ln.startswith("#")] == (
        ["ib_uverbs", "rdma_ucm", *(["nvidia-peermem"] if peermem else [])])
    alinux = {s.name for s in steps_for(inv, replace(f, os=ALINUX), host)}
    assert "rdma-packages-dnf" in alinux and "rdma-packages-apt" not in alinux
    # without fabric: the playbook is not run at all
    assert not any(s.playbook == "rdma" for s in steps_for(INV, f, HOST))


@pytest.mark.parametrize("os_info", [None, ALINUX], ids=["ubuntu", "alinux"])
@pytest.mark.parametrize("runtime", ["containerd", "docker"])
@pytest.mark.parametrize("gpus", [0, 8])
def test_every_combination_renders_to_valid_sh(os_info, runtime, gpus, tmp_path):
    inv = replace(INV, cluster=replace(INV.cluster, container_runtime=runtime))
    f = facts() if os_info is None else facts(os=os_info)
    if not gpus:
        f = replace(f, gpu=replace(f.gpu, gpus=()))
    host = replace(HOST, gpus=gpus)  # gpus: 0 makes a CPU node; a worker without gpus: is a GPU node
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


def test_containerd_config_dump_is_read_once_per_run_until_a_step_changes_something(tmp_path: Path) -> None:
    """Issue 27: `containerd config dump` (a Go process, ~40 ms of CPU) was run by four checks of every host's
    no-op install; gk_ctrd reads it once per run and a step that ran drops it, so a check after a change reads the
    new configuration. Counted with a fake containerd, not timed."""
    root = tmp_path
    (root / "bin").mkdir()
    (root / "tmp").mkdir()
    (root / "config").write_text("a = 1\n")
    fake = root / "bin" / "containerd"
    fake.write_text(f"#!/bin/sh\necho x >> {root}/dumps\n[ -e {root}/broken ] && exit 3\ncat {root}/config\n")
    fake.chmod(0o755)
    pb = parse_playbook(f"""name: t
steps:
  - name: one
    check: gk_ctrd && grep -q 'a = 1' "$GK_CTRD"
    run: exit 1
  - name: two
    check: gk_ctrd && grep -q 'b = 2' "$GK_CTRD"
    run: echo 'b = 2' >> {root}/config
  - name: three
    check: gk_ctrd && grep -q 'b = 2' "$GK_CTRD"
    run: exit 1
""", "t.yaml")
    script = build_script(render_playbook(pb, {}), owner="unit test", dry_run=False).replace(
        "/var/lib/gpuk8s", str(root / "state")).replace("export PATH=", f"export PATH={root}/bin:", 1)
    env = {**os.environ, "TMPDIR": str(root / "tmp")}

    def run() -> tuple[list[str], int]:
        (root / "dumps").unlink(missing_ok=True)
        p = subprocess.run(["sh", "-c", script], capture_output=True, text=True, env=env)
        dumps = len((root / "dumps").read_text().splitlines()) if (root / "dumps").exists() else 0
        return [s.status for s in parse_output(p.stdout).steps.values()], dumps

    assert run() == (["unchanged", "changed", "unchanged"], 2)  # once, and once more after 'two' changed it
    assert run() == (["unchanged", "unchanged", "unchanged"], 1)
    assert not list((root / "tmp").iterdir())  # the run's cache is gone with it
    (root / "broken").touch()  # a dump that fails fails every check that reads it, without a second try
    assert run() == (["failed"], 1)


# -- repository signing keys: https through redirects, plain http only with insecure_http, pinned fingerprints --

FP_A = "CDFA34FB7A63B7C6F032A15E3F46D06B5ECE7666"  # KEY_A below (an ed25519 key with a cv25519 subkey)
FP_B = "2DACF26AF4A30E35BFFBBD2D41A9E748BE895661"  # KEY_B below
# Public halves of two throwaway keys made for these tests (gpg --quick-gen-key; the secret halves are gone).
KEY_A = """-----BEGIN PGP PUBLIC KEY BLOCK-----

mDMEaw0gRxYJKwYBBAHaRw8BAQdAO6MkXNXdp/jajPKLLIBfajyClXbTK79G1b1v
JSLgCya0KWdwdWs4cyB1bml0IHRlc3Qga2V5IEEgPGFAZ3B1azhzLmludmFsaWQ+
iJAEExYIADgWIQTN+jT7emO3xvAyoV4/RtBrXs52ZgUCaw0gRwIbAwULCQgHAgYV
CgkICwIEFgIDAQIeAQIXgAAKCRA/RtBrXs52ZgNSAQDDfEKn0c9XH/hyzxQhkfQg
OPPiVY3Sle4xdeCWHVB8egD+PWlAmydCE0MBpXICTEgb2hDPivunG6PpriavFGB7
TQm4OARrDSBHEgorBgEEAZdVAQUBAQdA5UWWBvjDOnhpWAzZkXYhaXG8icOZMMNy
2Lop7qnYWG0DAQgHiHgEGBYIACAWIQTN+jT7emO3xvAyoV4/RtBrXs52ZgUCaw0g
RwIbDAAKCRA/RtBrXs52ZvAtAP9N7fi2I6MOHzDamzDJ5+IPaxR5cBoVHhyuHKDz
AbhtpwEAxbXJKK7tdw7rqnkYG3CXvoRFIIB4TMbifvAZT9lNwQQ=
=5VXv
-----END PGP PUBLIC KEY BLOCK-----
"""
KEY_B = """-----BEGIN PGP PUBLIC KEY BLOCK-----

mDMEaw0gRxYJKwYBBAHaRw8BAQdA1pt8RF3Qs7/fn3q5A/HM3W9waxn+rdlQdWK2
j7QmyCi0KWdwdWs4cyB1bml0IHRlc3Qga2V5IEIgPGJAZ3B1azhzLmludmFsaWQ+
iJAEExYIADgWIQQtrPJq9KMONb/7vS1BqedIvolWYQUCaw0gRwIbAwULCQgHAgYV
CgkICwIEFgIDAQIeAQIXgAAKCRBBqedIvolWYWCKAQDoJ5S9pe1DD7uH7ktYiIC2
sodfgZfAJXnP146vhyplQQD+PtkfI4Mp1ZiIJbyf9YckAOA/Yk9UXPQHsU0F+7mL
Rgc=
=WADX
-----END PGP PUBLIC KEY BLOCK-----
"""
KEY_SETTINGS: dict[str, dict[str, Any]] = {
    "none": {},
    "https-pinned": {
        "toolkit_repo": {"url": "https://mirror.lan/nvidia", "key_fingerprint": FP_A},
        "kubernetes_repo": {"url": "https://mirror.lan/k8s", "key_fingerprint": "0x" + FP_B.lower()}},
    "http-pinned": {
        "toolkit_repo": {"url": "http://mirror.lan/nvidia", "insecure_http": True, "key_fingerprint": FP_A},
        "kubernetes_repo": {"url": "http://mirror.lan/k8s", "insecure_http": True, "key_fingerprint": FP_B}},
}


def inv_with_keys(settings: dict[str, Any]) -> Inventory:
    import yaml

    text = ("cluster: {kubernetes_version: \"1.30\"}\n"
            "hosts:\n  - {name: cp-1, address: 10.0.0.10, role: control-plane}\n"
            "  - {name: gpu-1, address: 10.0.0.11, role: worker, gpus: 8}\n")
    return loads(text + (yaml.safe_dump({"install": settings}) if settings else ""))


def test_context_carries_the_repository_key_settings():
    ins = context(inv_with_keys(KEY_SETTINGS["http-pinned"]), HOST, facts())["install"]
    assert ins["toolkit_repo_insecure_http"] is True and ins["toolkit_repo_key_fingerprint"] == FP_A
    assert ins["kubernetes_repo_insecure_http"] is True and ins["kubernetes_repo_key_fingerprint"] == FP_B
    ins = context(inv_with_keys(KEY_SETTINGS["https-pinned"]), HOST, facts())["install"]
    assert ins["kubernetes_repo_key_fingerprint"] == FP_B and ins["kubernetes_repo_insecure_http"] is False
    ins = context(INV, HOST, facts())["install"]
    assert ins["toolkit_repo_key_fingerprint"] == ins["kubernetes_repo_key_fingerprint"] == ""
    assert ins["toolkit_repo_insecure_http"] is ins["kubernetes_repo_insecure_http"] is False


@pytest.mark.parametrize("os_info", [None, ALINUX], ids=["ubuntu", "alinux"])
@pytest.mark.parametrize("runtime", ["containerd", "docker"])
@pytest.mark.parametrize("which", list(KEY_SETTINGS))
def test_key_settings_render_to_valid_sh(which, runtime, os_info, tmp_path):
    base = inv_with_keys(KEY_SETTINGS[which])
    inv = replace(base, cluster=replace(base.cluster, container_runtime=runtime))
    steps = {s.name: s for s in steps_for(inv, facts() if os_info is None else facts(os=ALINUX))}
    for shell in ("sh", "bash") if shutil.which("bash") else ("sh",):
        for dry in (False, True):
            script = tmp_path / "s.sh"
            script.write_text(build_script(list(steps.values()), owner="test", dry_run=dry))
            p = subprocess.run([shell, "-n", str(script)], capture_output=True, text=True)
            assert p.returncode == 0, p.stderr
    pinned, http = which != "none", which == "http-pinned"
    proto = "proto==http,https" if http else "proto==https"
    if os_info is None:
        assert {"toolkit-apt-key", "kubernetes-apt-key"} <= set(steps)
        assert not {"toolkit-rpm-key", "kubernetes-rpm-key"} & set(steps)
        for name, fp in (("toolkit-apt-key", FP_A), ("kubernetes-apt-key", FP_B)):
            s = steps[name]
            assert proto in s.run and '--proto "$proto" --proto-redir "$proto"' in s.run
            assert (f"pin={fp}" if pinned else "pin=''") in s.run and (f"pin={fp}" if pinned else "pin=''") in s.check
            assert "the inventory pins $pin" in s.run and "gpg --dearmor" in s.run
        assert "url=http://mirror.lan/k8s/v1.30/deb/Release.key" in steps["kubernetes-apt-key"].run or not http
        return
    assert ("toolkit-rpm-key" in steps) == pinned and ("kubernetes-rpm-key" in steps) == pinned
    toolkit_repo = steps["toolkit-yum-repo"].file_content
    k8s_repo = steps["kubernetes-yum-repo"].file_content
    if pinned:
        assert "gpgkey=file:///etc/pki/rpm-gpg/gpuk8s-nvidia-container-toolkit.asc\n" in toolkit_repo
        assert "gpgkey=file:///etc/pki/rpm-gpg/gpuk8s-kubernetes.asc\n" in k8s_repo
        for name, fp, path in (("toolkit-rpm-key", FP_A, "gpuk8s-nvidia-container-toolkit.asc"),
                               ("kubernetes-rpm-key", FP_B, "gpuk8s-kubernetes.asc")):
            s = steps[name]
            assert proto in s.run and f"pin={fp}" in s.run and f"pin={fp}" in s.check
            assert f"/etc/pki/rpm-gpg/{path}" in s.run and s.changes == (f"/etc/pki/rpm-gpg/{path}",)
        names = list(steps)
        assert names.index("toolkit-rpm-key") < names.index("toolkit-yum-repo")
        assert names.index("kubernetes-rpm-key") < names.index("kubernetes-yum-repo")
        assert "baseurl=http://mirror.lan/k8s/v1.30/rpm/" in k8s_repo or not http
    else:
        assert "gpgkey=https://nvidia.github.io/libnvidia-container/gpgkey\n" in toolkit_repo
        assert "gpgkey=https://pkgs.k8s.io/core:/stable:/v1.30/rpm/repodata/repomd.xml.key\n" in k8s_repo


def run_key_step(step: RenderedStep, root: Path, served: str,
                 part: str = "run") -> subprocess.CompletedProcess[str]:
    """One key step's check or run, by sh on this machine: its directories moved under `root`, and a `curl`
    that serves `served` and logs its arguments (the real gpg and awk read the key)."""
    bin_dir = root / "bin"
    bin_dir.mkdir(exist_ok=True)
    (root / "served.asc").write_text(served)
    curl = bin_dir / "curl"
    curl.write_text(f'#!/bin/sh\necho "$@" >> {root}/curl.log\n'
                    'while [ $# -gt 0 ]; do [ "$1" = -o ] && { o=$2; shift; }; shift; done\n'
                    f'cp {root}/served.asc "$o"\n')
    curl.chmod(0o755)
    body = getattr(step, part)
    for d in ("/usr/share/keyrings", "/etc/apt/keyrings", "/etc/pki/rpm-gpg"):
        body = body.replace(d, f"{root}{d}")
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(root / "home"), "LC_ALL": "C"}
    return subprocess.run(["sh", "-c", ("set -e\n" if part == "run" else "") + body], capture_output=True,
                          text=True, env=env)


@pytest.mark.skipif(not shutil.which("gpg"), reason="checks real OpenPGP keys with GnuPG's gpg, which is not "
                    "installed here (apt-get install gnupg; .ci/run installs it)")
@pytest.mark.parametrize("os_info,name,dest", [
    (None, "toolkit-apt-key", "usr/share/keyrings/nvidia-container-toolkit-keyring.gpg"),
    (None, "kubernetes-apt-key", "etc/apt/keyrings/kubernetes-apt-keyring.gpg"),
    (ALINUX, "toolkit-rpm-key", "etc/pki/rpm-gpg/gpuk8s-nvidia-container-toolkit.asc"),
    (ALINUX, "kubernetes-rpm-key", "etc/pki/rpm-gpg/gpuk8s-kubernetes.asc"),
], ids=["toolkit-apt", "kubernetes-apt", "toolkit-rpm", "kubernetes-rpm"])
def test_key_steps_check_the_pinned_fingerprint_with_the_real_gpg(os_info, name, dest, tmp_path):
    f = facts() if os_info is None else facts(os=os_info)
    repo = "toolkit_repo" if name.startswith("toolkit") else "kubernetes_repo"

    def step(fp: str) -> RenderedStep:
        inv = inv_with_keys({repo: {"url": "http://mirror.lan/x", "insecure_http": True, "key_fingerprint": fp}})
        return {s.name: s for s in steps_for(inv, f)}[name]

    target = tmp_path / dest
    # the served key has another fingerprint: the step fails naming both, and nothing is installed
    r = run_key_step(step(FP_A), tmp_path, KEY_B)
    assert r.returncode != 0
    assert "the key served at http://mirror.lan/x/" in r.stderr
    assert f"has fingerprint {FP_B}, the inventory pins {FP_A}" in r.stderr
    assert lines_that_matter(r.stdout + r.stderr)[-1].startswith("Error: the key served at")
    assert not target.exists() and not list(target.parent.glob(".gpuk8s.*"))
    assert "--proto =http,https --proto-redir =http,https" in (tmp_path / "curl.log").read_text()
    # a file holding the pinned key and another one is refused too (apt would trust both)
    r = run_key_step(step(FP_A), tmp_path, KEY_A + KEY_B)
    assert r.returncode != 0 and f"holds several keys ({FP_A} {FP_B}), the inventory pins {FP_A}" in r.stderr
    # not a key at all
    r = run_key_step(step(FP_A), tmp_path, "<html>captive portal</html>\n")
    assert r.returncode != 0 and "is no OpenPGP key that gpg can read; the inventory pins" in r.stderr
    assert not target.exists()
    # the right key: installed, and the check (which reads the installed key; for apt, the dearmored
    # keyring) passes; the subkey's fingerprint is not taken for the primary key's
    assert run_key_step(step(FP_A), tmp_path, KEY_A, "check").returncode != 0
    r = run_key_step(step(FP_A), tmp_path, KEY_A)
    assert r.returncode == 0, r.stderr
    assert target.stat().st_size > 0 and oct(target.stat().st_mode & 0o777) == "0o644"
    assert run_key_step(step(FP_A), tmp_path, KEY_A, "check").returncode == 0
    assert not list(target.parent.glob(".gpuk8s.*"))
    # a newly pinned key: the installed one no longer passes the check, and the run replaces it
    assert run_key_step(step(FP_B), tmp_path, KEY_B, "check").returncode != 0
    assert run_key_step(step(FP_B), tmp_path, KEY_B).returncode == 0
    assert run_key_step(step(FP_B), tmp_path, KEY_B, "check").returncode == 0
    # gpg left nothing in HOME (the check also runs in --dry-run, which must change nothing)
    assert not (tmp_path / "home").exists()


@pytest.mark.skipif(not shutil.which("gpg"), reason="checks real OpenPGP keys with GnuPG's gpg, which is not "
                    "installed here (apt-get install gnupg; .ci/run installs it)")
def test_unpinned_apt_key_keeps_the_old_behaviour_over_https(tmp_path):
    s = {s.name: s for s in steps_for(INV)}["kubernetes-apt-key"]
    r = run_key_step(s, tmp_path, KEY_B)
    assert r.returncode == 0, r.stderr
    assert "--proto =https --proto-redir =https" in (tmp_path / "curl.log").read_text()
    assert run_key_step(s, tmp_path, KEY_A, "check").returncode == 0  # no pin: any installed keyring is kept


def test_a_run_killed_after_its_change_still_restarts_on_the_next_run(tmp_path: Path) -> None:
    """The restart marker is set before a step's commands run: a kill between writing the new configuration
    and the end of the step must not leave a service on its old configuration for good."""
    root = tmp_path
    pb = parse_playbook(f"""
name: t
steps:
  - name: conf
    check: grep -q new {root}/app.conf
    run: |
      echo new > {root}/app.conf
      kill -KILL $$  # the whole script ($$ in a subshell is the script)
    restarts: app
  - name: app-restarted
    check: "! gk_restart_pending app"
    run: echo restarted >> {root}/restarts && rm -f {root}/state/restart-app
""", "t.yaml")
    script = build_script(render_playbook(pb, {}), owner="unit test", dry_run=False).replace(
        "/var/lib/gpuk8s", str(root / "state"))
    first = subprocess.run(["sh", "-c", script], capture_output=True, text=True)
    assert first.returncode != 0 and (root / "app.conf").read_text() == "new\n"  # killed after the change
    second = subprocess.run(["sh", "-c", script], capture_output=True, text=True)
    assert second.returncode == 0, second.stdout + second.stderr
    assert (root / "restarts").read_text() == "restarted\n"
    assert not (root / "state/restart-app").exists()


def test_docker_daemon_json_created_by_gpuk8s_is_backed_up_as_absent(tmp_path: Path) -> None:
    """A host without /etc/docker/daemon.json: the backup says there was none (so --purge removes the file),
    not a `{}` written before the backup was taken."""
    if shutil.which("python3") is None:
        pytest.skip("the daemon-json step edits daemon.json with the host's python3, which this machine lacks "
                    "(Debian and Ubuntu have it; .ci/run's machine does)")
    [step] = render_playbook(load_playbook("docker"), {"gpu": False, "registry": {"insecure_hosts": ""}})[:1]
    assert step.name == "daemon-json"
    script = build_script([step], owner="unit test", dry_run=False).replace(
        "/var/lib/gpuk8s", str(tmp_path / "state")).replace("/etc/docker", str(tmp_path / "etc/docker"))
    p = subprocess.run(["sh", "-c", script], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "native.cgroupdriver=systemd" in (tmp_path / "etc/docker/daemon.json").read_text()
    backup = tmp_path / f"state/backup{tmp_path}/etc/docker/daemon.json"
    assert Path(f"{backup}.absent").exists() and not backup.exists()


def test_docker_reaches_a_plain_http_mirror_through_insecure_registries(tmp_path: Path) -> None:
    """A registry mirror over plain http (a bundle's server): daemon.json's insecure-registries names it, beside
    what the user had there (kept, not doubled); the next run's check finds it so and changes nothing."""
    if shutil.which("python3") is None:
        pytest.skip("the daemon-json step edits daemon.json with the host's python3, which this machine lacks "
                    "(Debian and Ubuntu have it; .ci/run's machine does)")
    import json as _json

    conf = tmp_path / "etc/docker/daemon.json"
    conf.parent.mkdir(parents=True)
    conf.write_text('{"insecure-registries": ["site.example:5000"], "log-driver": "journald"}')
    [step] = render_playbook(load_playbook("docker"), {"gpu": True, "registry": {
        "insecure_hosts": "10.0.0.1:5480,site.example:5000"}})[:1]
    assert "insecure-registries 10.0.0.1:5480,site.example:5000" in step.title
    script = build_script([step], owner="unit test", dry_run=False).replace(
        "/var/lib/gpuk8s", str(tmp_path / "state")).replace("/etc/docker", str(tmp_path / "etc/docker"))
    first = subprocess.run(["sh", "-c", script], capture_output=True, text=True)
    assert first.returncode == 0, first.stdout + first.stderr
    d = _json.loads(conf.read_text())
    assert d["insecure-registries"] == ["site.example:5000", "10.0.0.1:5480"] and d["log-driver"] == "journald"
    assert d["default-runtime"] == "nvidia" and "native.cgroupdriver=systemd" in d["exec-opts"]
    assert [o.status for o in parse_output(first.stdout).steps.values()] == ["changed"]
    again = subprocess.run(["sh", "-c", script], capture_output=True, text=True)
    assert [o.status for o in parse_output(again.stdout).steps.values()] == ["unchanged"], again.stdout


def test_the_playbook_script_travels_on_stdin_not_on_a_command_line():
    # a command line is readable by every local user (/proc/PID/cmdline); the script may carry a hosts.toml
    # with a registry's Authorization header
    from gpuk8s.playbook.script import stdin_launcher

    script = b"secret=CANARY-7f3a; read x || echo stdin-is-empty; exit 7\n"
    launcher = stdin_launcher(len(script))
    assert b"CANARY" not in launcher.encode()
    before = set(Path("/tmp").glob("gpuk8s-playbook.*"))
    p = subprocess.run(["sh", "-c", launcher], input=script, capture_output=True)
    assert p.returncode == 7 and p.stdout == b"stdin-is-empty\n", p  # the steps read /dev/null
    assert set(Path("/tmp").glob("gpuk8s-playbook.*")) == before  # the script's directory is removed
    short = subprocess.run(["sh", "-c", launcher], input=script[:-5], capture_output=True)
    assert short.returncode == 1 and b"did not arrive whole" in short.stderr


def test_templates_are_compiled_once_per_run_not_per_host():
    """Rendering the playbooks for many hosts compiles each template once (jinja2's from_string compiles every
    time: 60 ms of client CPU per host); the hosts still get their own values (counted, not timed)."""
    from gpuk8s.playbook import render

    render._template.cache_clear()
    render._expression.cache_clear()
    first = steps_for(host=replace(HOST, name="w-0", address="10.0.0.20"))
    compiled = render._template.cache_info().misses + render._expression.cache_info().misses
    assert compiled > 20
    for k in range(1, 30):
        steps = steps_for(host=replace(HOST, name=f"w-{k}", address=f"10.0.0.{20 + k}"))
        assert [s.name for s in steps] == [s.name for s in first]
    assert render._template.cache_info().misses + render._expression.cache_info().misses == compiled
    assert render._template.cache_info().hits > 29 * 20
