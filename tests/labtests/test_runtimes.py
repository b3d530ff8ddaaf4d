"""containerd 1.7 and 2.x, the toolkit's drop-in and cgroup v2 on the lab (issue 16): full installs that end with
every GPU schedulable and a no-op re-run, and the preflight verdicts that go with them.

Ubuntu 22.04's own containerd is 1.7: its version is faked (runtime_version) while Debian's real containerd 1.6
binary judges every version 2 config; once install put containerd.io 2.x there, the lab's containerd 2.x fake
answers (config default/dump in the version 3 layout, imports merged as containerd 2 merges them).
"""

from __future__ import annotations

import json

import tomllib

from gpuk8s import versions
from tests.labtests.test_install import changing_calls

DEFAULT = versions.default_minor()
PIN = versions.matrix().containerd_version
# the oldest minor that has not reached its end of life on the day the matrix was checked
OLDEST = min((m for m in versions.matrix().minors.values() if not m.end_of_life_reached(versions.matrix().checked)),
             key=lambda m: m.number).minor
# Ubuntu 22.04's containerd (jammy-updates), with the version 2 config someone wrote for it
UBUNTU_17 = "1.7.28"
OLD_CONFIG = """version = 2

[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
  SystemdCgroup = true
"""


def fleet(minor: str, os: str = "ubuntu-22.04", runtime_version: str = UBUNTU_17, config: str | None = OLD_CONFIG,
          **extra: object) -> str:
    cfg = "" if config is None else "    containerd_config: |\n" + "".join(
        f"      {ln}\n" for ln in config.splitlines())
    more = "".join(f"    {k}: {json.dumps(v)}\n" for k, v in extra.items())
    return (f'cluster: {{kubernetes_version: "{minor}"}}\n'
            f"defaults:\n    os: {os}\n    runtime_version: {json.dumps(runtime_version)}\n{cfg}{more}"
            "hosts:\n  - name: cp-1\n    role: control-plane\n  - name: gpu-1\n    gpus: 4\n"
            "  - name: gpu-2\n    gpus: 2\n")


def full_install(run_cli, lab, tmp_path):
    """gpuk8s install (every phase), then again: the second run changes nothing on any host."""
    r = run_cli("install", "-i", str(lab.inventory), "-o", "json", "--kubeconfig-out", str(tmp_path / "k"))
    assert r.returncode == 0, r.stdout + r.stderr
    rep = json.loads(r.stdout)
    assert rep["ok"] and rep["changed"]
    nodes = {n["node"]: n for n in rep["nodes"]}
    assert nodes["gpu-1"]["allocatable_gpus"] == 4 and nodes["gpu-2"]["allocatable_gpus"] == 2
    assert all(n["ok"] and n["ready"] for n in nodes.values())
    before = {n: len(h.commands()) for n, h in lab.hosts.items()}
    files = {n: (h.read("/etc/containerd/config.toml"), h.read("/etc/containerd/conf.d/99-nvidia.toml"))
             for n, h in lab.hosts.items()}
    r2 = run_cli("install", "-i", str(lab.inventory), "-o", "json", "--kubeconfig-out", str(tmp_path / "k"))
    rep2 = json.loads(r2.stdout)
    assert r2.returncode == 0 and rep2["ok"] and not rep2["changed"], r2.stdout + r2.stderr
    assert {p["name"]: p["status"] for p in rep2["phases"]}["prepare"] == "unchanged"
    assert all(n["ok"] for n in rep2["nodes"])
    for n, h in lab.hosts.items():
        assert changing_calls(h.commands()[before[n]:]) == [], n
        assert (h.read("/etc/containerd/config.toml"), h.read("/etc/containerd/conf.d/99-nvidia.toml")) == files[n]
    return rep


def dump(h) -> str:
    return h.exec("containerd config dump").stdout


def test_ubuntu_2204_default_minor_upgrades_containerd_17_to_2x(lab_up, run_cli, tmp_path):
    assert versions.kubernetes(DEFAULT).containerd_floor.startswith("2.")  # the default needs containerd 2.x
    lab = lab_up(fleet(DEFAULT))
    full_install(run_cli, lab, tmp_path)
    for name in ("cp-1", "gpu-1", "gpu-2"):
        h = lab.host(name)
        st = h.state()
        assert st["packages"]["containerd.io"] == f"{PIN}~ubuntu.22.04~jammy", name
        assert h.exec("containerd --version").stdout.split()[2] == PIN.split("-")[0]
        assert "deb [signed-by=/usr/share/keyrings/gpuk8s-docker.gpg] https://download.docker.com/linux/ubuntu " \
               "jammy stable" in h.read("/etc/apt/sources.list.d/gpuk8s-docker.list")
        cfg = tomllib.loads(h.read("/etc/containerd/config.toml"))
        assert cfg["version"] == 3 and "/etc/containerd/conf.d/*.toml" in cfg["imports"]
        runc = cfg["plugins"]["io.containerd.cri.v1.runtime"]["containerd"]["runtimes"]["runc"]
        assert runc["options"]["SystemdCgroup"] is True
        # the version 2 file of containerd 1.7 is kept, once, in gpuk8s's backup
        assert h.read("/var/lib/gpuk8s/backup/etc/containerd/config.toml") == OLD_CONFIG
        assert st["services"]["containerd"] == "active"
        d = dump(h)
        assert "[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]" in d
        assert "SystemdCgroup = true" in d
    for name in ("gpu-1", "gpu-2"):
        h = lab.host(name)
        drop = tomllib.loads(h.read("/etc/containerd/conf.d/99-nvidia.toml"))
        c = drop["plugins"]["io.containerd.cri.v1.runtime"]["containerd"]
        assert drop["version"] == 3 and c["default_runtime_name"] == "nvidia"
        assert c["runtimes"]["nvidia"]["options"]["BinaryName"] == "/usr/bin/nvidia-container-runtime"
        # config.toml itself does not name nvidia: containerd reads it from the drop-in
        assert "nvidia" not in h.read("/etc/containerd/config.toml")
        assert "default_runtime_name = 'nvidia'" in dump(h)
        assert h.read("/var/lib/gpuk8s/backup/etc/containerd/conf.d/99-nvidia.toml") is None
        assert h.upper("/var/lib/gpuk8s/backup/etc/containerd/conf.d/99-nvidia.toml.absent").exists()
        assert h.state()["packages"]["nvidia-container-toolkit"] == versions.pins(DEFAULT).toolkit
    assert lab.host("cp-1").read("/etc/containerd/conf.d/99-nvidia.toml") is None  # no GPUs: no nvidia runtime


def test_alibaba_cloud_linux_3_default_minor(lab_up, run_cli, tmp_path):
    # containerd.io 1.6 from Docker's repository, with the config it ships (CRI disabled, no version line)
    shipped = 'disabled_plugins = ["cri"]\n'
    lab = lab_up(fleet(DEFAULT, os="alinux-3", runtime_version="1.6.32", config=shipped))
    full_install(run_cli, lab, tmp_path)
    for name in ("cp-1", "gpu-1", "gpu-2"):
        h = lab.host(name)
        assert h.state()["packages"]["containerd.io"] == f"{PIN}.el8"
        repo = h.read("/etc/yum.repos.d/gpuk8s-docker.repo")
        assert "baseurl=https://download.docker.com/linux/rhel/8/$basearch/stable" in repo
        cfg = tomllib.loads(h.read("/etc/containerd/config.toml"))
        assert cfg["version"] == 3 and cfg["disabled_plugins"] == []
        assert h.read("/var/lib/gpuk8s/backup/etc/containerd/config.toml") == shipped
        assert any(a[:2] == ["dnf", "install"] and f"containerd.io-{PIN.split('-')[0]}" in a for a in h.commands())
    assert "default_runtime_name = 'nvidia'" in dump(lab.host("gpu-1"))


def test_ubuntu_2204_oldest_supported_minor_keeps_containerd_17_with_the_drop_in(lab_up, run_cli, tmp_path):
    assert not versions.kubernetes(OLDEST).containerd_floor.startswith("2.")
    lab = lab_up(fleet(OLDEST))
    full_install(run_cli, lab, tmp_path)
    for name in ("cp-1", "gpu-1"):
        h = lab.host(name)
        assert "containerd.io" not in h.state()["packages"]
        assert h.read("/etc/apt/sources.list.d/gpuk8s-docker.list") is None
        assert h.exec("containerd --version").stdout.split()[2] == UBUNTU_17
        assert tomllib.loads(h.read("/etc/containerd/config.toml"))["version"] == 2
    h = lab.host("gpu-1")
    # toolkit >= 1.18 on containerd 1.7: the drop-in holds the CRI plugin's whole table (containerd 1.x replaces
    # a plugin's table with an import's), and Debian's real containerd reads it so
    assert versions.pins(OLDEST).toolkit == h.state()["packages"]["nvidia-container-toolkit"]
    drop = tomllib.loads(h.read("/etc/containerd/conf.d/99-nvidia.toml"))
    c = drop["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]
    assert drop["version"] == 2 and c["default_runtime_name"] == "nvidia"
    assert c["runtimes"]["runc"]["options"]["SystemdCgroup"] is True
    assert tomllib.loads(h.read("/etc/containerd/config.toml"))["imports"] == ["/etc/containerd/conf.d/*.toml"]
    d = dump(h)
    assert 'default_runtime_name = "nvidia"' in d and "/etc/containerd/conf.d/99-nvidia.toml" in d


def preflight(run_cli, lab) -> tuple[int, dict[str, dict[str, dict]]]:
    r = run_cli("preflight", "-i", str(lab.inventory), "-o", "json", "--network-seconds", "0")
    rep = json.loads(r.stdout)
    return r.returncode, {h["name"]: {c["id"]: c for c in h["checks"]} for h in rep["hosts"]}


def test_preflight_containerd_17_with_a_minor_that_needs_2x_names_what_install_does(lab_up, run_cli):
    lab = lab_up(fleet(DEFAULT, config=None))
    rc, checks = preflight(run_cli, lab)
    c = checks["gpu-1"]["runtime.kubernetes-compat"]
    assert c["status"] == "warn" and c["severity"] == "error"
    assert c["message"].startswith(f"Kubernetes {DEFAULT} needs containerd >= 2.0, found {UBUNTU_17}")
    assert c["remedy"].startswith(f"gpuk8s install upgrades it: containerd.io {PIN} (containerd "
                                  f"{PIN.split('-')[0]}) from Docker's apt repository (linux/ubuntu)")
    assert checks["gpu-1"]["k8s.cgroup-v2"]["status"] == "pass"
    assert rc == 0  # a host that install can fix passes preflight


def test_toolkit_118_0s_config_d_drop_in_is_named_and_install_moves_it(lab_up, run_cli):
    lab = lab_up(fleet(OLDEST, config=None))
    h = lab.host("gpu-1")
    # toolkit 1.18.0 prepared by gpuk8s, then `nvidia-ctk runtime configure` run by hand with its defaults
    inv = lab.inventory.read_text().replace("install:\n", "install:\n  toolkit_version: 1.18.0-1\n", 1)
    (lab.root / "inv-118.yaml").write_text(inv)
    r = run_cli("install", "-i", str(lab.root / "inv-118.yaml"), "--prepare-only", "-o", "json")
    assert r.returncode == 0, r.stdout + r.stderr
    h.exec("rm -f /etc/containerd/conf.d/99-nvidia.toml && "
           "sed -i '/^imports/d' /etc/containerd/config.toml && "
           "nvidia-ctk runtime configure --runtime=containerd --set-as-default")
    assert h.read("/etc/containerd/config.d/99-nvidia.toml") is not None  # the bug, as 1.18.0 had it
    rc, checks = preflight(run_cli, lab)
    c = checks["gpu-1"]["toolkit.dropin-path"]
    assert c["status"] == "warn" and "/etc/containerd/config.d/99-nvidia.toml" in c["message"]
    assert "issue 1404" in c["message"] and c["remedy"].startswith("gpuk8s install moves it")
    assert checks["gpu-2"]["toolkit.dropin-path"]["status"] == "pass"
    # install with the matrix's toolkit moves it away and writes conf.d/99-nvidia.toml
    r = run_cli("install", "-i", str(lab.inventory), "--prepare-only", "-o", "json")
    assert r.returncode == 0, r.stdout + r.stderr
    assert h.read("/etc/containerd/config.d/99-nvidia.toml") is None
    assert h.read("/var/lib/gpuk8s/backup/etc/containerd/config.d/99-nvidia.toml") is not None
    assert "config.d" not in h.read("/etc/containerd/config.toml")
    assert 'default_runtime_name = "nvidia"' in dump(h)
    rc, checks = preflight(run_cli, lab)
    assert checks["gpu-1"]["toolkit.dropin-path"]["status"] == "pass"


def test_preflight_cgroup_v1_fails_from_135_on(lab_up, run_cli):
    lab = lab_up(fleet(DEFAULT, cgroup=1))
    rc, checks = preflight(run_cli, lab)
    c = checks["gpu-1"]["k8s.cgroup-v2"]
    assert c["status"] == "fail" and "kubelet is configured to not run on a host using cgroup v1" in c["message"]
    assert "systemd.unified_cgroup_hierarchy=1" in c["remedy"] and rc != 0
    before = f"1.{int(versions.matrix().cgroup_v2_from.split('.')[1]) - 1}"  # the last minor that runs on v1
    inv = lab.inventory.read_text().replace(f"kubernetes_version: '{DEFAULT}'", f"kubernetes_version: '{before}'")
    assert inv != lab.inventory.read_text()
    (lab.root / "inv-134.yaml").write_text(inv)
    r = run_cli("preflight", "-i", str(lab.root / "inv-134.yaml"), "-o", "json", "--network-seconds", "0")
    c = {c["id"]: c for c in json.loads(r.stdout)["hosts"][1]["checks"]}["k8s.cgroup-v2"]
    assert c["status"] == "pass" and "cgroup v1" in c["message"]


# --- review 2, group A --------------------------------------------------------------------------------------------

def prepare(run_cli, lab) -> tuple[int, dict]:
    from tests.labtests.test_install import install

    r, rep = install(run_cli, lab)
    return r.returncode, rep


def test_a_stale_toolkit_drop_in_is_rebuilt_so_config_toml_edits_reach_containerd_1x(lab_up, run_cli):
    """Finding 2: someone ran `nvidia-ctk runtime configure` (toolkit >= 1.18) while SystemdCgroup was false; its
    drop-in holds a copy of the CRI table, which Debian's real containerd 1.6 puts in place of config.toml's."""
    assert versions.pins(OLDEST).toolkit >= "1.18"
    lab = lab_up(fleet(OLDEST, config=None))
    h = lab.host("gpu-1")
    h.write("/etc/containerd/config.toml", 'version = 2\nimports = ["/etc/containerd/conf.d/*.toml"]\n\n'
            '[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]\n  SystemdCgroup = false\n')
    h.write("/etc/containerd/conf.d/99-nvidia.toml",
            'version = 2\n\n[plugins."io.containerd.grpc.v1.cri".containerd]\n  default_runtime_name = "nvidia"\n\n'
            '[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia]\n'
            '  runtime_type = "io.containerd.runc.v2"\n\n'
            '[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia.options]\n'
            '  BinaryName = "/usr/bin/nvidia-container-runtime"\n  SystemdCgroup = false\n\n'
            '[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]\n  SystemdCgroup = false\n')
    d = tomllib.loads(dump(h))
    assert d["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]["default_runtime_name"] == "nvidia"
    rc, rep = prepare(run_cli, lab)
    assert rc == 0, json.dumps(rep, indent=1)
    runtimes = tomllib.loads(dump(h))["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]["runtimes"]
    assert runtimes["runc"]["options"]["SystemdCgroup"] is True
    assert runtimes["nvidia"]["options"]["SystemdCgroup"] is True
    before = len(h.commands())
    files = (h.read("/etc/containerd/config.toml"), h.read("/etc/containerd/conf.d/99-nvidia.toml"))
    rc, rep = prepare(run_cli, lab)
    assert rc == 0 and changing_calls(h.commands()[before:]) == []
    gpu1 = {x["name"]: x for x in rep["hosts"]}["gpu-1"]
    assert {s["status"] for s in gpu1["steps"]} == {"unchanged"}, json.dumps(gpu1, indent=1)
    assert (h.read("/etc/containerd/config.toml"), h.read("/etc/containerd/conf.d/99-nvidia.toml")) == files


def test_dockers_own_apt_source_is_used_instead_of_a_second_one(lab_up, run_cli):
    """Finding 4: Docker's install guide's docker.list names the same repository with its own keyring; a second
    entry with another signed-by stopped apt ("E: Conflicting values set for option Signed-By")."""
    lab = lab_up(fleet(DEFAULT, config=None))
    h = lab.host("gpu-1")
    h.write("/etc/apt/keyrings/docker.asc", "-----BEGIN PGP PUBLIC KEY BLOCK-----\n(Docker's key)\n")
    h.write("/etc/apt/sources.list.d/docker.list", "deb [arch=amd64 signed-by=/etc/apt/keyrings/docker.asc] "
            "https://download.docker.com/linux/ubuntu jammy stable\n")
    rc, rep = prepare(run_cli, lab)
    assert rc == 0, json.dumps(rep, indent=1)
    assert h.read("/etc/apt/sources.list.d/gpuk8s-docker.list") is None
    step = {s["name"]: s for s in {x["name"]: x for x in rep["hosts"]}["gpu-1"]["steps"]}["containerd-apt-repo"]
    assert step["status"] == "changed" and step["notes"] == [
        "using the existing source of https://download.docker.com/linux/ubuntu jammy in: "
        "/etc/apt/sources.list.d/docker.list (not writing /etc/apt/sources.list.d/gpuk8s-docker.list: apt refuses "
        "two with different keys)"]
    assert h.state()["packages"]["containerd.io"] == f"{PIN}~ubuntu.22.04~jammy"
    assert h.exec("apt-get update", check=False).returncode == 0
    # the lab's apt refuses the duplicate as apt does
    h.write("/etc/apt/sources.list.d/x.list", "deb [signed-by=/usr/share/keyrings/gpuk8s-docker.gpg] "
            "https://download.docker.com/linux/ubuntu jammy stable\n")
    p = h.exec("apt-get update", check=False)
    assert p.returncode == 100 and "E: Conflicting values set for option Signed-By" in p.stderr
    # another host without Docker's source gets gpuk8s's own
    assert "gpuk8s-docker.gpg" in lab.host("gpu-2").read("/etc/apt/sources.list.d/gpuk8s-docker.list")


def test_installing_containerd_io_does_not_remove_docker_io(lab_up, run_cli):
    """Finding 5: Ubuntu's docker.io depends on containerd, which containerd.io replaces: apt-get -y removed it."""
    lab = lab_up(fleet(DEFAULT, config=None))
    h = lab.host("gpu-1")
    st = h.state()
    h.update_state(packages={**st.get("packages", {}), "docker.io": "24.0.7-0ubuntu2~22.04.1",
                             "containerd": "1.7.28-0ubuntu1~22.04.2"})
    rc, rep = prepare(run_cli, lab)
    assert rc != 0
    gpu1 = {x["name"]: x for x in rep["hosts"]}["gpu-1"]
    assert "would remove docker.io" in json.dumps(gpu1), json.dumps(gpu1, indent=1)
    pkgs = h.state()["packages"]
    assert "docker.io" in pkgs and "containerd.io" not in pkgs
    assert "containerd.io" in lab.host("gpu-2").state()["packages"]  # the others went on


def test_moving_to_containerd_2x_keeps_the_edited_config_and_the_old_drop_in_dated(lab_up, run_cli):
    """Finding 3: the backup keeps only the file from before gpuk8s's first change; the config that gpuk8s
    prepared for containerd 1.x and someone edited since was lost when the upgrade replaced it."""
    from tests.labtests.test_install import SUDO_ENV

    lab = lab_up(fleet(OLDEST, config=None))
    rc, rep = prepare(run_cli, lab)
    assert rc == 0, json.dumps(rep, indent=1)
    h = lab.host("gpu-1")
    # edited in the host's own view (its overlay caches what gpuk8s wrote)
    h.exec("echo '# edited by hand after gpuk8s' >> /etc/containerd/config.toml && "
           "chmod 640 /etc/containerd/config.toml")
    edited = h.exec("cat /etc/containerd/config.toml").stdout
    assert edited.endswith("# edited by hand after gpuk8s\n")
    old_drop = h.read("/etc/containerd/conf.d/99-nvidia.toml")
    inv = lab.inventory.read_text().replace(f"kubernetes_version: '{OLDEST}'", f"kubernetes_version: '{DEFAULT}'")
    assert inv != lab.inventory.read_text()
    (lab.root / "inv-new.yaml").write_text(inv)
    r = run_cli("install", "-i", str(lab.root / "inv-new.yaml"), "-o", "json", "--prepare-only", env=SUDO_ENV)
    assert r.returncode == 0, r.stdout + r.stderr
    kept = h.exec("ls /etc/containerd /etc/containerd/conf.d").stdout.split()
    [cfg] = [k for k in kept if k.startswith("config.toml.gpuk8s-")]
    [drop] = [k for k in kept if k.startswith("99-nvidia.toml.gpuk8s-")]
    assert h.read(f"/etc/containerd/{cfg}") == edited
    assert h.exec(f"stat -c %a /etc/containerd/{cfg}").stdout.strip() == "640"
    assert h.read(f"/etc/containerd/conf.d/{drop}") == old_drop and "version = 2" in old_drop
    assert tomllib.loads(h.read("/etc/containerd/config.toml"))["version"] == 3
    notes = [n for s in {x["name"]: x for x in json.loads(r.stdout)["hosts"]}["gpu-1"]["steps"]
             for n in s.get("notes", [])]
    assert f"kept the previous /etc/containerd/config.toml as /etc/containerd/{cfg}" in notes
