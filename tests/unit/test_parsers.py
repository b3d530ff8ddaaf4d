"""Pure parsers of remote output, on real captured output (H200) and observed forms."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuk8s.facts.parse import (
    Section,
    _MiniToml,
    parse_containerd_config,
    parse_daemon_json,
    parse_nvidia_smi,
    parse_os_release,
    parse_probe,
    parse_runtime_version,
    split_sections,
)
from gpuk8s.preflight.network import parse_iperf3, parse_ping
from gpuk8s.versions import at_least, cuda_versions_supported, release

FIX = Path(__file__).resolve().parent.parent / "fixtures"


def test_real_h200_probe_output():
    """Captured by running gpuk8s's probe on a real NVIDIA H200 host (driver 580.159.04)."""
    f = parse_probe((FIX / "h200" / "probe.txt").read_text())
    assert f.gpu.state == "ok"
    assert f.gpu.driver == "580.159.04" and f.gpu.driver_release == (580, 159, 4)
    (gpu,) = f.gpu.gpus
    assert gpu.name == "NVIDIA H200" and gpu.memory_mib == 143771 and gpu.mig_mode == "Disabled"
    assert gpu.uuid.startswith("GPU-e2e39985")
    assert f.os.id == "ubuntu" and f.os.version_id == "24.04" and f.os.family == "debian"
    assert f.cpus == 16 and f.memory_mb == 131981020 // 1024
    assert f.containerd is None and f.docker is None  # not installed there
    assert f.sysctl["net.ipv4.ip_forward"] == "0"
    assert f.modules is None  # lsmod missing on that host: unknown, not "no modules"


def test_real_h200_probe_output_with_capped_sections():
    """Captured on another H200 host after the probe began capping each section (head -c, status on fd 3)."""
    text = (FIX / "h200" / "probe-capped.txt").read_text()
    f = parse_probe(text)
    assert f.gpu.state == "ok" and f.gpu.driver == "580.159.04"
    assert [g.uuid for g in f.gpu.gpus] == ["GPU-c8bab6b3-248f-e7bc-3bc0-10e93eab48f1"]
    # exit statuses still come through: 127 for a missing command, 1 for a missing file
    assert "@@gpuk8s-end containerd-version 127" in text and "@@gpuk8s-end docker-daemon 1" in text
    assert f.containerd is None and f.modules is None


def test_real_nvidia_smi_version_gives_cuda():
    extra = (FIX / "h200" / "extra.txt").read_text()
    version = extra.split("===")[-1].replace("rc=0", "")
    g = parse_nvidia_smi(Section("0, NVIDIA H200, GPU-x, 580.159.04, 143771, Disabled", 0), Section(version, 0))
    assert g.cuda_version == "13.0"


@pytest.mark.parametrize("out,rc,state,needle", [
    ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the latest "
     "NVIDIA driver is installed and running.", 9, "failed", "couldn't communicate"),
    ("Failed to initialize NVML: Driver/library version mismatch", 18, "failed", "version mismatch"),
    ("No devices were found", 6, "failed", "No devices"),
    ("nvidia-smi: command not found", 127, "absent", "not found"),
    ("0, A100, GPU-1, 535.104.05", 0, "failed", "unexpected"),
])
def test_nvidia_smi_failures(out, rc, state, needle):
    g = parse_nvidia_smi(Section(out, rc))
    assert g.state == state and needle in g.error


def test_multi_gpu_mig():
    text = "\n".join(f"{i}, NVIDIA A100-SXM4-80GB, GPU-{i}, 470.82.01, 81920, Enabled" for i in range(8))
    g = parse_nvidia_smi(Section(text, 0))
    assert len(g.gpus) == 8 and g.gpus[7].index == 7 and g.gpus[0].mig_mode == "Enabled"


@pytest.mark.parametrize("text,expected", [
    ("418.87.01", (418, 87, 1)), ("19.03.5", (19, 3, 5)), ("1.6.20~ds1", (1, 6, 20)), ("v1.7.2", (1, 7, 2)),
    ("20.10.24+dfsg1", (20, 10, 24)), ("Docker version 28.2.2, build e6534b4", (28, 2, 2)), ("none", None),
])
def test_release(text, expected):
    assert release(text) == expected


def test_version_ordering():
    assert at_least((19, 3, 5), (19, 3, 5)) and not at_least((19, 3, 5), (19, 3, 10))
    assert at_least((418, 87, 1), (418, 87, 1)) and not at_least((418, 39), (418, 87, 1))
    assert cuda_versions_supported((418, 87, 1))[0] == "10.1"
    assert cuda_versions_supported((535, 104, 5))[0] == "12"
    assert cuda_versions_supported((580, 159, 4))[0] == "13"


@pytest.mark.parametrize("text,version", [
    ("containerd github.com/containerd/containerd 1.6.20~ds1 1.6.20~ds1-1+deb12u3", (1, 6, 20)),
    ("containerd containerd.io 1.6.21 3dce8eb055cbb6872793272b4f20ed16117344f8", (1, 6, 21)),
    ("containerd github.com/containerd/containerd v1.7.2 0cae528dd6cb557f7201036e9f43420650207b58", (1, 7, 2)),
])
def test_containerd_versions(text, version):
    rt = parse_runtime_version("containerd", Section(text, 0), Section("active", 0))
    assert rt is not None and rt.release == version and rt.active is True


def test_alinux_os_release_is_rhel_family():
    text = ('NAME="Alibaba Cloud Linux"\nVERSION="3 (Soaring Falcon)"\nID="alinux"\n'
            'ID_LIKE="rhel fedora centos anolis"\nVERSION_ID="3"\n')
    o = parse_os_release(text)
    assert (o.id, o.version_id, o.family) == ("alinux", "3", "rhel")


def test_containerd_config_v2_with_nvidia():
    text = """version = 2
disabled_plugins = []
[plugins]
  [plugins."io.containerd.grpc.v1.cri".containerd]
    default_runtime_name = "nvidia"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia.options]
        BinaryName = "/usr/bin/nvidia-container-runtime"
        SystemdCgroup = true
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
      SystemdCgroup = true
"""
    c = parse_containerd_config(Section(text, 0))
    assert c.default_runtime == "nvidia" and c.nvidia_runtime and c.systemd_cgroup is True
    assert c.disabled_plugins == ()


def test_containerd_io_disables_cri():
    c = parse_containerd_config(Section('#   Copyright 2018-2022 Docker Inc.\ndisabled_plugins = ["cri"]\n', 0))
    assert c.disabled_plugins == ("cri",) and c.default_runtime is None


def test_containerd_multiline_array_and_dropin():
    main = 'version = 2\nimports = [\n  "/etc/containerd/conf.d/*.toml",\n]\ndisabled_plugins = [\n]\n'
    drop = '[plugins."io.containerd.grpc.v1.cri".containerd]\n  default_runtime_name = "nvidia"\n'
    c = parse_containerd_config(Section(main, 0), Section(drop, 0))
    assert c.imports == ("/etc/containerd/conf.d/*.toml",) and c.default_runtime == "nvidia"


def test_daemon_json():
    d = parse_daemon_json(Section('{"default-runtime": "nvidia", "runtimes": {"nvidia": {"path": '
                                  '"nvidia-container-runtime", "args": []}}, "exec-opts": '
                                  '["native.cgroupdriver=systemd"]}', 0))
    assert d.default_runtime == "nvidia" and d.nvidia_runtime and d.cgroup_driver == "systemd"
    assert "not valid JSON" in parse_daemon_json(Section("{", 0)).error


def test_ping_and_iperf3():
    assert parse_ping("rtt min/avg/max/mdev = 0.041/0.050/0.060/0.008 ms") == 0.05
    assert parse_ping("5 packets transmitted, 0 received, 100% packet loss") is None
    assert parse_iperf3('{"end": {"sum_received": {"bits_per_second": 9.4e9}}}') == pytest.approx(9.4)
    assert parse_iperf3('{"error": "unable to connect"}') is None


def test_sections_keep_exit_status():
    s = split_sections("@@gpuk8s-begin a\nx\ny\n\n@@gpuk8s-end a 3\n")
    assert s["a"] == Section("x\ny", 3)


# containerd 2.x default (config version 3) with nvidia-ctk >= 1.18's drop-in, as each writes them
CONTAINERD2_CONFIG = """version = 3
root = '/var/lib/containerd'
imports = ['/etc/containerd/conf.d/*.toml']
disabled_plugins = []

[plugins]
  [plugins.'io.containerd.cri.v1.runtime']
    enable_selinux = false
    [plugins.'io.containerd.cri.v1.runtime'.containerd]
      default_runtime_name = 'runc'
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes]
        [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
          runtime_type = 'io.containerd.runc.v2'
          [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
            SystemdCgroup = true
  [plugins.'io.containerd.gc.v1.scheduler']
    pause_threshold = 0.02
    schedule_delay = '0s'
"""
NVIDIA_DROPIN = """version = 3

[plugins]

  [plugins."io.containerd.cri.v1.runtime"]

    [plugins."io.containerd.cri.v1.runtime".containerd]
      default_runtime_name = "nvidia"

      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes]

        [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.nvidia]
          privileged_without_host_devices = false
          runtime_type = "io.containerd.runc.v2"

          [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.nvidia.options]
            BinaryName = "/usr/bin/nvidia-container-runtime"
            SystemdCgroup = true
"""


def test_containerd2_config_with_framed_dropins():
    """Each drop-in is parsed on its own (they define the same tables) and merged in order: later wins."""
    other = '[plugins."io.containerd.cri.v1.runtime".containerd]\n  default_runtime_name = "runc"\n'
    drops = (f"@@file /etc/containerd/conf.d/10-other.toml\n{other}\n"
             f"@@file /etc/containerd/conf.d/99-nvidia.toml\n{NVIDIA_DROPIN}\n")
    c = parse_containerd_config(Section(CONTAINERD2_CONFIG, 0), Section(drops, 0))
    assert not c.error and c.default_runtime == "nvidia" and c.nvidia_runtime and c.systemd_cgroup is True
    assert c.imports == ("/etc/containerd/conf.d/*.toml",) and c.disabled_plugins == ()
    first, nvidia = drops.split("@@file /etc/containerd/conf.d/99-nvidia.toml\n")
    swapped = f"@@file /etc/containerd/conf.d/99-nvidia.toml\n{nvidia}" + first.replace("10-other", "zz-other")
    assert parse_containerd_config(Section(CONTAINERD2_CONFIG, 0), Section(swapped, 0)).default_runtime == "runc"


def test_containerd_dropin_may_turn_systemd_cgroup_off_and_disable_more_plugins():
    main = 'version = 2\ndisabled_plugins = ["io.containerd.internal.v1.tracing"]\n' \
           '[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]\n  SystemdCgroup = true\n'
    drop = ('@@file /etc/containerd/conf.d/50.toml\ndisabled_plugins = ["cri"]\n'
            '[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]\nSystemdCgroup = false\n')
    c = parse_containerd_config(Section(main, 0), Section(drop, 0))
    assert c.systemd_cgroup is False and c.disabled_plugins == ("io.containerd.internal.v1.tracing", "cri")


def test_containerd_config_version_1():
    text = '[plugins.cri.containerd]\n  default_runtime_name = "nvidia"\n' \
           '[plugins.cri.containerd.runtimes.nvidia]\n  runtime_type = "io.containerd.runc.v2"\n'
    c = parse_containerd_config(Section(text, 0))
    assert c.default_runtime == "nvidia" and c.nvidia_runtime and c.systemd_cgroup is None


def test_invalid_dropin_is_named():
    drops = "@@file /etc/containerd/conf.d/10-ok.toml\nversion = 2\n@@file /etc/containerd/conf.d/99-nvidia.toml\n[x\n"
    c = parse_containerd_config(Section("version = 2\n", 0), Section(drops, 0))
    assert c.present and c.error_file == "/etc/containerd/conf.d/99-nvidia.toml"
    assert c.error.startswith("/etc/containerd/conf.d/99-nvidia.toml is not valid TOML: ")


@pytest.mark.parametrize("text", [CONTAINERD2_CONFIG, NVIDIA_DROPIN, """
# every TOML form the Python 3.10 reader knows
a = 'literal \\ string'
b = "basic \\"quoted\\" \\u00e9 \\t"
c = \"\"\"
multi \\
   line\"\"\"\"
d = '''raw
lines'''
e = [1, 2,
  # a comment
  "three", [true, false], {x = 1, y.z = "w"},]
f = 1_000
g = -7
h = 1.5e3
i = 1979-05-27T07:32:00Z
"quoted.key" = 1
dotted.key.here = 2
[[arr]]
n = 1
[[arr]]
n = 2
[arr.sub]
m = 3
"""])
def test_python310_toml_reader_agrees_with_tomllib(text):
    tomllib = pytest.importorskip("tomllib", reason="Python 3.10 has no tomllib to compare gpuk8s's 3.10 "
                                  "TOML reader with; on 3.11+ (CI) this runs")
    expected = tomllib.loads(text)
    if "i" in expected:
        expected["i"] = "1979-05-27T07:32:00Z"  # dates stay text on Python 3.10
    assert _MiniToml(text).document() == expected
