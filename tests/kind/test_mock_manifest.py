"""What test_mock_gpus.py applies, checked without Docker (these run wherever `make test` runs): gpuk8s's device
plugin manifest pointed at nvml-mock's driver root changes in those settings only, the chart's values, the pin.
"""

from __future__ import annotations

import copy
import re
import subprocess
import sys
from pathlib import Path

import yaml

from tests.kind import nvml_mock
from tests.kind.conftest import CONFIG, Kind

INVENTORY = {
    "cluster": {"name": "kind-mock", "kubernetes_version": "1.36"},
    "hosts": [{"name": "gpuk8s-test-control-plane", "address": "127.0.0.1", "role": "control-plane"},
              {"name": "gpuk8s-test-worker2", "address": "127.0.0.3", "gpus": nvml_mock.GPUS}],
}


def rendered(tmp_path: Path) -> list[dict]:
    (tmp_path / "inventory.yaml").write_text(yaml.safe_dump(INVENTORY))
    r = subprocess.run([sys.executable, "-m", "gpuk8s", "render", "-i", str(tmp_path / "inventory.yaml"),
                        "--output-dir", str(tmp_path / "out")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return [d for d in yaml.safe_load_all((tmp_path / "out" / "nvidia-device-plugin.yaml").read_text()) if d]


def test_the_plugin_pointed_at_the_mock_changes_its_driver_root_settings_only(tmp_path):
    docs = rendered(tmp_path)
    before = copy.deepcopy(docs)
    out = nvml_mock.point_at_mock(docs)
    assert docs == before  # the rendered objects are not changed in place
    [ds] = [d for d in out if d["kind"] == "DaemonSet"]
    spec = ds["spec"]["template"]["spec"]
    [ctr] = [c for c in spec["containers"] if c["name"] == nvml_mock.PLUGIN_CONTAINER]
    env = {e["name"]: e.get("value") for e in ctr["env"]}
    assert env["NVIDIA_DRIVER_ROOT"] == env["DRIVER_ROOT_CTR_PATH"] == "/var/lib/nvml-mock/driver"
    assert env["DEVICE_DISCOVERY_STRATEGY"] == "nvml" and env["PASS_DEVICE_SPECS"] == "true"
    assert ctr["command"] == ["nvidia-device-plugin"] and env["CONFIG_FILE"] == "/config/config.yaml"
    assert ctr["securityContext"] == {"privileged": True}  # no allowPrivilegeEscalation: false beside it
    assert {"name": "nvml-mock", "mountPath": "/var/lib/nvml-mock", "readOnly": True} in ctr["volumeMounts"]
    assert {"name": "nvml-mock", "hostPath": {"path": "/var/lib/nvml-mock"}} in spec["volumes"]
    # undo those changes: what is left is gpuk8s's rendering, object for object
    ctr["env"] = [e for e in ctr["env"] if e["name"] not in nvml_mock.MOCK_ENV]
    ctr["volumeMounts"] = [v for v in ctr["volumeMounts"] if v["name"] != "nvml-mock"]
    spec["volumes"] = [v for v in spec["volumes"] if v["name"] != "nvml-mock"]
    [orig] = [c for d in before if d["kind"] == "DaemonSet" for c in d["spec"]["template"]["spec"]["containers"]
              if c["name"] == nvml_mock.PLUGIN_CONTAINER]
    ctr["securityContext"] = orig["securityContext"]
    assert out == before


def test_the_chart_values_pin_the_local_image_and_the_mock_node():
    v = nvml_mock.values("gpuk8s-test-worker2")
    assert v["image"] == {"repository": "gpuk8s-nvml-mock", "tag": nvml_mock.COMMIT[:12], "pullPolicy": "Never"}
    assert f"{v['image']['repository']}:{v['image']['tag']}" == nvml_mock.IMAGE
    # values.schema.json at the pin: gpu.count an integer 1..64 (or ""), the profile a file of profiles/
    assert isinstance(v["gpu"]["count"], int) and 1 <= v["gpu"]["count"] <= 64 and v["gpu"]["profile"] == "a100"
    assert v["nodeSelector"] == {"kubernetes.io/hostname": "gpuk8s-test-worker2"}


def test_nvml_mock_is_pinned_by_commit():
    assert re.fullmatch(r"[0-9a-f]{40}", nvml_mock.COMMIT)
    assert nvml_mock.REPO == "https://github.com/NVIDIA/k8s-test-infra"


def test_the_kind_cluster_has_the_worker_the_mock_gpu_tests_use():
    """kind names its nodes NAME-control-plane, NAME-worker, NAME-worker2, ... in the config's order."""
    roles = [n["role"] for n in yaml.safe_load(CONFIG.read_text())["nodes"]]
    assert roles == ["control-plane", "worker", "worker"]
    k = Kind("gpuk8s-test", Path("kubeconfig"))
    assert (k.worker, k.mock_gpu_node) == ("gpuk8s-test-worker", "gpuk8s-test-worker2")
