"""Shared fixtures: the lab (real sshd in network namespaces) and a runner for the gpuk8s CLI."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import settings

ROOT = Path(__file__).resolve().parent.parent

# No hypothesis deadline anywhere: property tests check what a parser answers, not how fast (speed is make bench's,
# never a timed test's); under make test's 4 workers a 200 ms deadline failed a TOML example at 263 ms in CI.
settings.register_profile("gpuk8s", deadline=None)
settings.load_profile("gpuk8s")


def lab_unavailable() -> str | None:
    if os.geteuid() != 0:
        return "the lab needs root (network namespaces, mounts); run make test as root"
    if subprocess.run(["ip", "netns", "list"], capture_output=True).returncode != 0:
        return "the lab needs 'ip netns' (iproute2) and network namespaces"
    if not Path("/usr/sbin/sshd").exists():
        return "the lab needs openssh-server (make lab-deps)"
    return None


@pytest.fixture
def run_cli(tmp_path: Path) -> Callable[..., subprocess.CompletedProcess[str]]:
    """Run `python -m gpuk8s ARGS` as a user would; its log goes to a file under tmp_path."""

    def run(*args: str, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        e = {**os.environ, "GPUK8S_LOG_FILE": str(tmp_path / "gpuk8s.log"), "NO_COLOR": "1", **(env or {})}
        return subprocess.run([sys.executable, "-m", "gpuk8s", *args], capture_output=True, text=True, env=e,
                              timeout=timeout, cwd=tmp_path, stdin=subprocess.DEVNULL)

    return run


@pytest.fixture
def lab_up(tmp_path: Path) -> Iterator[Callable[[str], object]]:
    """Bring up a lab from fleet YAML text; torn down after the test."""
    reason = lab_unavailable()
    if reason:
        pytest.skip(reason)
    from tests.lab.lab import Lab

    lab = Lab()

    def up(fleet_yaml: str) -> Lab:
        f = tmp_path / "fleet.yaml"
        f.write_text(fleet_yaml)
        lab.up(f)
        return lab

    yield up
    lab.down()


# The longest test files, longest first (seconds on a 2-core machine under make test's 3 workers): they start first,
# so that make test's workers end together (pytest-xdist hands out whole files in collection order) instead of one
# worker starting a 2-minute file when the others are done.
LONGEST_FIRST = ("test_interruptions.py", "test_scenarios.py", "test_dra.py", "test_driver.py", "test_mig_install.py",
                 "test_hostile_hosts.py", "test_sharing.py", "test_reset.py", "test_monitoring.py", "test_wheel.py",
                 "test_faults.py", "test_cluster.py", "test_upgrade.py", "test_lab.py", "test_lab_instrument.py")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Everything under tests/labtests runs on the lab: mark it so that `-m 'not lab'` skips it. The longest files
    first (a stable sort: each file's tests keep their order)."""
    for item in items:
        if "labtests" in item.path.parts:
            item.add_marker(pytest.mark.lab)
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))
