"""A kind cluster for the `kind` tests: the one named $GPUK8S_KIND_CLUSTER if it exists, else one made here.

Without Docker, kind and kubectl (as on our own machines) every test here is skipped with the reason, unless
$GPUK8S_KIND_REQUIRED is set (the kind workflow sets it): then they fail. The mock GPU tests (test_mock_gpus.py)
need helm and git as well, and the cluster's second worker (kind-config.yaml); docs/kind.md says how to run them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import pytest

CONFIG = Path(__file__).resolve().parent / "kind-config.yaml"


def kind_unavailable() -> str | None:
    missing = [t for t in ("docker", "kind", "kubectl") if shutil.which(t) is None]
    if missing:
        return (f"the kind smoke tests need Docker, kind and kubectl; missing here: {', '.join(missing)} "
                "(they run in .github/workflows/kind.yml; locally: make test-kind)")
    if subprocess.run(["docker", "info"], capture_output=True).returncode != 0:
        return "the kind smoke tests need a running Docker daemon ('docker info' failed)"
    return None


def unavailable(reason: str) -> NoReturn:
    """Skip with the reason; fail where $GPUK8S_KIND_REQUIRED is set (in the kind workflow a skip would pass for a
    success)."""
    if os.environ.get("GPUK8S_KIND_REQUIRED"):
        pytest.fail(reason)
    pytest.skip(reason)


@dataclass
class Kind:
    name: str
    kubeconfig: Path

    @property
    def worker(self) -> str:
        return f"{self.name}-worker"

    @property
    def mock_gpu_node(self) -> str:
        """The second worker: the GPU node of the mock GPU tests (nvml-mock runs there only)."""
        return f"{self.name}-worker2"

    @property
    def control_plane(self) -> str:
        return f"{self.name}-control-plane"

    def kubectl(self, *args: str, stdin: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
        r = subprocess.run(["kubectl", "--kubeconfig", str(self.kubeconfig), *args], input=stdin, capture_output=True,
                           text=True, timeout=120)
        if check and r.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed ({r.returncode}): {r.stderr}")
        return r


@pytest.fixture(scope="session")
def kind(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kind]:
    reason = kind_unavailable()
    if reason:
        unavailable(reason)
    name = os.environ.get("GPUK8S_KIND_CLUSTER", "gpuk8s-test")
    created = False
    if name not in subprocess.run(["kind", "get", "clusters"], capture_output=True, text=True).stdout.split():
        subprocess.run(["kind", "create", "cluster", "--name", name, "--config", str(CONFIG), "--wait", "180s"],
                       check=True)
        created = True
    kc = tmp_path_factory.mktemp("kind") / "kubeconfig"
    kc.write_text(subprocess.run(["kind", "get", "kubeconfig", "--name", name], capture_output=True, text=True,
                                 check=True).stdout)
    yield Kind(name, kc)
    if created and not os.environ.get("GPUK8S_KIND_KEEP"):
        subprocess.run(["kind", "delete", "cluster", "--name", name], check=False)
