"""NVIDIA/k8s-test-infra's mock NVIDIA driver on a kind node, for tests/kind/test_mock_gpus.py.

The project calls it nvml-mock; it was gpu-mock until its PR #275 ("feat: rebrand gpu-mock -> nvml-mock across
entire codebase", commit bab29f5f, 2026-04-02). Its Helm chart installs a DaemonSet that lays out, on every node it
runs on, a mock driver root (deployments/nvml-mock/helm/nvml-mock/README.md at COMMIT, "What It Does"):

    /var/lib/nvml-mock/driver/usr/lib64/libnvidia-ml.so*   the mock NVML library
    /var/lib/nvml-mock/driver/dev/nvidia{N,ctl,-uvm,...}   mock device nodes
    /var/lib/nvml-mock/driver/config/config.yaml           the GPU configuration (profile, count)

and labels the node nvidia.com/gpu.present=true. "Consumers (DRA driver, device plugin) point at
/var/lib/nvml-mock/driver as the NVIDIA driver root and discover GPUs through standard NVML APIs."

Its quick start "Device Plugin on KIND" (the same README, option B: build from source) is what this module does:
docker build -f deployments/nvml-mock/Dockerfile, kind load docker-image, helm install the chart with
image.repository/image.tag set to the local image. The device plugin there is tests/e2e/device-plugin-mock.yaml,
whose arguments `point_at_mock` gives gpuk8s's own device plugin DaemonSet (see there).

Run as `python -m tests.kind.nvml_mock [CLUSTER]`: fetch the source at COMMIT, build the image (once) and load it
into the kind cluster's mock GPU node (the kind workflow does this in its own step, so that the build shows).
"""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = "https://github.com/NVIDIA/k8s-test-infra"
# Tag v0.3.0 of NVIDIA/k8s-test-infra (2026-08-01; `git rev-parse v0.3.0^{commit}` in a clone of the repository).
# tests/e2e/device-plugin-mock.yaml is the same there as on main at 3b2b865d (2026-08-21).
COMMIT = "204019fb69e4d49285625a6829ff0e5b143bba3b"
IMAGE_REPOSITORY = "gpuk8s-nvml-mock"
IMAGE = f"{IMAGE_REPOSITORY}:{COMMIT[:12]}"
DOCKERFILE = "deployments/nvml-mock/Dockerfile"
CHART = "deployments/nvml-mock/helm/nvml-mock"
RELEASE = NAMESPACE = "nvml-mock"  # the chart names its DaemonSet after the release

ROOT = "/var/lib/nvml-mock"  # what the chart writes on the node
DRIVER_ROOT = f"{ROOT}/driver"  # the mock driver root
PROFILE = "a100"  # the chart's default GPU profile (8 devices); GPUS of them are exposed
GPUS = 4  # mock GPUs on the mock node

PLUGIN_CONTAINER = "nvidia-device-plugin-ctr"  # in gpuk8s/data/nvidia-device-plugin.yaml.j2
MOCK_VOLUME = "nvml-mock"
# tests/e2e/device-plugin-mock.yaml at COMMIT runs the plugin with these arguments; gpuk8s's DaemonSet gets the
# same settings as the environment variables the plugin reads for them (NVIDIA/k8s-device-plugin
# cmd/nvidia-device-plugin/main.go at v0.20.0: --driver-root NVIDIA_DRIVER_ROOT, --driver-root-ctr-path
# DRIVER_ROOT_CTR_PATH, --device-discovery-strategy DEVICE_DISCOVERY_STRATEGY, --pass-device-specs
# PASS_DEVICE_SPECS), so that its command and its config-manager stay as gpuk8s renders them.
MOCK_ENV = {
    "NVIDIA_DRIVER_ROOT": DRIVER_ROOT,  # --nvidia-driver-root
    "DRIVER_ROOT_CTR_PATH": DRIVER_ROOT,  # --driver-root-ctr-path: the mock root mounted at the same path
    "DEVICE_DISCOVERY_STRATEGY": "nvml",  # --device-discovery-strategy=nvml
    # --pass-device-specs=true: "deliver the allocated GPU's device node into the container ... A real node gets
    # this from the container runtime hook; a kind node has none, so the device plugin must do it directly."
    "PASS_DEVICE_SPECS": "true",
}


def tools_missing() -> str | None:
    """Why the mock GPU tests cannot run here beyond what conftest.kind_unavailable says, or None."""
    missing = [t for t in ("helm", "git") if shutil.which(t) is None]
    if missing:
        return (f"the mock GPU kind tests also need helm and git (nvml-mock's chart, its source at {COMMIT[:12]}); "
                f"missing here: {', '.join(missing)}")
    return None


def _run(*args: str, cwd: Path | None = None, timeout: float = 600, quiet: bool = True,
         env: dict[str, str] | None = None) -> str:
    r = subprocess.run(list(args), cwd=cwd, capture_output=quiet, text=True, timeout=timeout,
                       env={**os.environ, **env} if env else None)
    if r.returncode != 0:
        tail = (r.stderr or r.stdout or "")[-4000:] if quiet else "(output above)"
        raise RuntimeError(f"{' '.join(args)} failed ({r.returncode}): {tail}")
    return r.stdout or ""


def source() -> Path:
    """The source of NVIDIA/k8s-test-infra at COMMIT: $GPUK8S_NVML_MOCK_SRC (a checkout at COMMIT), else a shallow
    fetch of COMMIT into ~/.cache/gpuk8s (made once)."""
    given = os.environ.get("GPUK8S_NVML_MOCK_SRC")
    if given:
        src = Path(given)
    else:
        src = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "gpuk8s" / \
            f"k8s-test-infra-{COMMIT[:12]}"
        if not (src / ".git").exists():
            src.mkdir(parents=True, exist_ok=True)
            _run("git", "init", "-q", str(src))
            _run("git", "fetch", "-q", "--depth", "1", REPO, COMMIT, cwd=src)
            _run("git", "checkout", "-q", "FETCH_HEAD", cwd=src)
    head = _run("git", "rev-parse", "HEAD", cwd=src).strip()
    if head != COMMIT:
        raise RuntimeError(f"{src} is at {head}, not at the pinned {COMMIT} (tests/kind/nvml_mock.py)")
    return src


def build(src: Path, quiet: bool = True) -> str:
    """The nvml-mock image built from `src` (only when the Docker engine does not have it yet)."""
    if subprocess.run(["docker", "image", "inspect", IMAGE], capture_output=True).returncode != 0:
        # BuildKit: the Dockerfile uses COPY --chmod and TARGETARCH (the default builder from Docker 23 on)
        _run("docker", "build", "-t", IMAGE, "-f", str(src / DOCKERFILE), str(src), timeout=3600, quiet=quiet,
             env={"DOCKER_BUILDKIT": "1"})
    return IMAGE


def load(cluster: str, node: str, quiet: bool = True) -> None:
    """The image into the kind node's containerd (the chart's pods run it with imagePullPolicy Never)."""
    _run("kind", "load", "docker-image", IMAGE, "--name", cluster, "--nodes", node, timeout=900, quiet=quiet)


def values(node: str, gpus: int = GPUS) -> dict[str, Any]:
    """The chart's values (values.yaml and values.schema.json at COMMIT): the local image, GPUS devices of the
    profile, and the mock GPU node only (the chart's default tolerates every taint and runs everywhere)."""
    return {"image": {"repository": IMAGE_REPOSITORY, "tag": COMMIT[:12], "pullPolicy": "Never"},
            "gpu": {"profile": PROFILE, "count": gpus},
            "nodeSelector": {"kubernetes.io/hostname": node}}


def install(kubeconfig: Path, src: Path, node: str, workdir: Path, gpus: int = GPUS) -> None:
    """helm upgrade --install of the chart at COMMIT, waiting for its DaemonSet."""
    vals = workdir / "nvml-mock-values.json"
    vals.write_text(json.dumps(values(node, gpus)))
    _run("helm", "upgrade", "--install", RELEASE, str(src / CHART), "--kubeconfig", str(kubeconfig), "--namespace",
         NAMESPACE, "--create-namespace", "-f", str(vals), "--wait", "--timeout", "300s", timeout=420)


def uninstall(kubeconfig: Path) -> None:
    subprocess.run(["helm", "uninstall", RELEASE, "--kubeconfig", str(kubeconfig), "--namespace", NAMESPACE,
                    "--wait", "--timeout", "120s"], capture_output=True, timeout=180)  # not installed: nothing to do


def point_at_mock(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """gpuk8s's rendered device plugin manifest (nvidia-device-plugin.yaml), pointed at the mock driver root as
    tests/e2e/device-plugin-mock.yaml at COMMIT points NVIDIA's plugin at it: MOCK_ENV on the plugin container, the
    node's /var/lib/nvml-mock mounted read-only at the same path, and the container privileged (as there). Nothing
    else changes: the image gpuk8s pins, the config-manager and its ConfigMap, the node selector, tolerations and
    RBAC stay as gpuk8s renders them.

    gpuk8s has no setting for a driver root other than / (the container toolkit gives its plugin the driver), so
    the test does this to the rendered objects; see docs/kind.md."""
    out = copy.deepcopy(docs)
    [ds] = [d for d in out if d.get("kind") == "DaemonSet"]
    spec = ds["spec"]["template"]["spec"]
    [ctr] = [c for c in spec["containers"] if c["name"] == PLUGIN_CONTAINER]
    clash = sorted({e["name"] for e in ctr.get("env", [])} & set(MOCK_ENV))
    if clash:
        raise ValueError(f"gpuk8s's plugin container already sets {', '.join(clash)}: point_at_mock needs a look")
    ctr["env"] = [*ctr.get("env", []), *({"name": k, "value": v} for k, v in MOCK_ENV.items())]
    ctr["securityContext"] = {"privileged": True}
    ctr["volumeMounts"] = [*ctr.get("volumeMounts", []), {"name": MOCK_VOLUME, "mountPath": ROOT, "readOnly": True}]
    spec["volumes"] = [*spec.get("volumes", []), {"name": MOCK_VOLUME, "hostPath": {"path": ROOT}}]
    return out


_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")


def main(argv: list[str]) -> int:
    cluster = argv[0] if argv else os.environ.get("GPUK8S_KIND_CLUSTER", "gpuk8s-test")
    node = argv[1] if len(argv) > 1 else f"{cluster}-worker2"
    if not _NAME.match(cluster) or not _NAME.match(node):
        print(f"usage: python -m tests.kind.nvml_mock [CLUSTER [NODE]] ({cluster!r}, {node!r})", file=sys.stderr)
        return 2
    src = source()
    print(f"nvml-mock: {REPO} at {COMMIT} in {src}", flush=True)
    print(f"nvml-mock: image {build(src, quiet=False)}", flush=True)
    load(cluster, node, quiet=False)
    print(f"nvml-mock: loaded into {node} of kind cluster {cluster}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
