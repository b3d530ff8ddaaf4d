"""The artifact users install: the sdist and the wheel built from it, installed into a fresh virtual environment
outside the checkout, run from there: every command's --help, inventory init and validate, render, versions, and a
preflight and install on the lab. Every other test runs the editable checkout, which hides a package or a data file
missing from the wheel (a wheel without gpuk8s.doctor crashed on every command)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.wheel import build, install, wheel_names

Run = Callable[..., subprocess.CompletedProcess[str]]


def tree_files() -> set[str]:
    """The files of the source tree that belong in the package, as the wheel names them."""
    tracked = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "gpuk8s", "playbooks"],
                             cwd=ROOT, check=True, capture_output=True, text=True).stdout.split()
    out = set()
    for rel in tracked:
        if not (ROOT / rel).is_file():
            continue  # deleted in the work tree, not yet in git
        out.add("gpuk8s/playbooks/" + rel.removeprefix("playbooks/") if rel.startswith("playbooks/") else rel)
    return out


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("wheel")
    sdist, wheel = build(d / "dist")
    exe = install(wheel, d / "venv")
    assert ROOT not in exe.resolve().parents
    return {"sdist": sdist, "wheel": wheel, "exe": exe, "venv": d / "venv"}


@pytest.fixture
def installed(built: dict[str, Path], tmp_path: Path) -> Run:
    """Run the installed gpuk8s in an empty directory outside the checkout, where the checkout cannot be imported."""

    def run(*args: str, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        e = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        e.update({"GPUK8S_LOG_FILE": str(tmp_path / "gpuk8s.log"), "NO_COLOR": "1", **(env or {})})
        return subprocess.run([str(built["exe"]), *args], capture_output=True, text=True, env=e, cwd=tmp_path,
                              timeout=timeout, stdin=subprocess.DEVNULL)

    return run


def test_the_wheel_and_sdist_hold_every_file_of_the_package(built: dict[str, Path]) -> None:
    in_wheel = set(wheel_names(built["wheel"]))
    missing = sorted(tree_files() - in_wheel)
    assert not missing, f"files of the tree missing from the wheel: {missing}"
    with tarfile.open(built["sdist"]) as t:
        top = t.getnames()[0].split("/")[0]
        in_sdist = {n.removeprefix(top + "/") for n in t.getnames()}
    assert {"pyproject.toml", "README.md", "gpuk8s/doctor/classify.py", "playbooks/cluster/reset-node.sh"} <= in_sdist


def test_the_installed_package_imports_from_the_venv_not_the_checkout(built: dict[str, Path], tmp_path: Path) -> None:
    py = built["venv"] / "bin" / "python"
    r = subprocess.run([str(py), "-c", "import gpuk8s, gpuk8s.doctor.classify; print(gpuk8s.__file__)"],
                       capture_output=True, text=True, cwd=tmp_path, check=True)
    assert str(built["venv"]) in r.stdout, r.stdout


def command_paths(built: dict[str, Path], tmp_path: Path) -> list[list[str]]:
    """Every command and subcommand of the installed CLI, read from its own command tree (a group has `commands`;
    typer may bring its own click, so no click class is named)."""
    code = (
        "import json, typer.main\n"
        "from gpuk8s import cli\n"
        "cli._register_commands()\n"
        "def walk(cmd, path):\n"
        "    yield path\n"
        "    for name, sub in (getattr(cmd, 'commands', None) or {}).items():\n"
        "        yield from walk(sub, path + [name])\n"
        "print(json.dumps(list(walk(typer.main.get_command(cli.app), []))))\n"
    )
    r = subprocess.run([str(built["venv"] / "bin" / "python"), "-c", code], capture_output=True, text=True,
                       cwd=tmp_path, check=True)
    return json.loads(r.stdout)


def test_every_command_of_the_installed_cli_shows_its_help(built: dict[str, Path], installed: Run,
                                                            tmp_path: Path) -> None:
    paths = command_paths(built, tmp_path)
    names = {" ".join(p) for p in paths}
    assert {"", "preflight", "install", "doctor", "status", "inventory", "inventory import"} <= names
    r = installed("--help")  # the console script itself
    assert r.returncode == 0 and "Usage:" in r.stdout, (r.stdout, r.stderr)
    # every command's help in one process of the installed package (a process per command cost ~1 s of CPU each)
    code = (
        "import json, sys\n"
        "from typer.testing import CliRunner\n"
        "from gpuk8s import cli\n"
        "cli._register_commands()\n"
        "runner = CliRunner()\n"
        "out = {}\n"
        "for p in json.loads(sys.argv[1]):\n"
        "    r = runner.invoke(cli.app, [*p, '--help'], prog_name='gpuk8s')\n"
        "    out[' '.join(p)] = [r.exit_code, r.output, repr(r.exception) if r.exit_code else '']\n"
        "print(json.dumps(out))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    r = subprocess.run([str(built["venv"] / "bin" / "python"), "-c", code, json.dumps(paths)], capture_output=True,
                       text=True, cwd=tmp_path, env={**env, "NO_COLOR": "1"}, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    helps = json.loads(r.stdout)
    assert set(helps) == names
    for name, (rc, out, exc) in helps.items():
        assert rc == 0, (name, out, exc)
        assert f"Usage: gpuk8s {name}".rstrip() + " " in out, (name, out)


def test_the_installed_cli_writes_validates_and_renders_an_inventory(installed: Run, tmp_path: Path) -> None:
    r = installed("inventory", "init", "inventory.yaml")
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "inventory.yaml").exists()
    r = installed("inventory", "validate", "-i", "inventory.yaml")
    assert r.returncode == 0, r.stdout + r.stderr
    r = installed("render", "-i", "inventory.yaml")
    assert r.returncode == 0, r.stderr
    assert "kind: ClusterConfiguration" in r.stdout and "nvidia-device-plugin" in r.stdout
    r = installed("versions", "-o", "json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["default"]


FLEET = """
hosts:
  - name: cp-1
    role: control-plane
  - name: gpu-1
    gpus: 2
"""


@pytest.mark.lab
def test_the_installed_cli_preflights_and_installs_a_cluster_on_the_lab(lab_up: Callable[[str], object],
                                                                         installed: Run, tmp_path: Path) -> None:
    lab = lab_up(FLEET)
    inv = str(lab.inventory)  # type: ignore[attr-defined]
    r = installed("preflight", "-i", inv, "-o", "json")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert json.loads(r.stdout)["summary"]["ok"] is True
    r = installed("install", "-i", inv, "-o", "json", "--kubeconfig-out", str(tmp_path / "admin.kubeconfig"))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    out = json.loads(r.stdout)
    assert out["ok"] is True
    # the playbooks and the cluster scripts came from the installed package: the hosts were prepared and joined
    nodes = lab.host("cp-1").exec("kubectl --kubeconfig /etc/kubernetes/admin.conf get nodes -o json").stdout  # type: ignore[attr-defined]
    assert {n["metadata"]["name"] for n in json.loads(nodes)["items"]} == {"cp-1", "gpu-1"}


def test_a_bundle_carries_the_installed_gpuk8s_and_its_dependencies_as_wheels_a_site_installs_offline(
        built: dict[str, Path], tmp_path: Path) -> None:
    """gpuk8s/bundle/wheel.py run in the installed venv: gpuk8s's wheel rebuilt from what pip installed holds the
    very files of the wheel users install (same names, same bytes; RECORD written anew), every dependency is
    rebuilt too, and a fresh venv installs gpuk8s from those wheels alone (--no-index) and runs it."""
    import hashlib
    import zipfile

    out = tmp_path / "wheels"
    py = built["venv"] / "bin" / "python"
    r = subprocess.run([str(py), "-c", "import sys, json; from pathlib import Path; from gpuk8s.bundle.wheel import "
                        "wheels; w = wheels(Path(sys.argv[1])); print(json.dumps({'built': {k: str(v) for k, v in "
                        "w.built.items()}, 'missing': w.missing}))", str(out)],
                       capture_output=True, text=True, cwd=tmp_path, timeout=300,
                       env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert got["missing"] == [], got["missing"]
    names = {Path(p).name.split("-")[0] for p in got["built"].values()}
    assert {"gpuk8s", "typer", "fabric", "rich", "pyyaml", "packaging", "jinja2", "paramiko"} <= names, names

    def contents(whl: Path) -> dict[str, str]:
        with zipfile.ZipFile(whl) as z:
            return {n: hashlib.sha256(z.read(n)).hexdigest() for n in z.namelist() if not n.endswith("/RECORD")}

    mine = next(Path(p) for p in got["built"].values() if Path(p).name.startswith("gpuk8s-"))
    assert mine.name == built["wheel"].name
    assert contents(mine) == contents(built["wheel"])
    venv = tmp_path / "site-venv"  # without a pip of its own (seconds faster): this pip installs into it
    subprocess.run(["python3", "-m", "venv", "--without-pip", str(venv)], check=True, timeout=300)
    r = subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q",
                        "--no-index", "--find-links", str(out), "gpuk8s"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    r = subprocess.run([str(venv / "bin" / "gpuk8s"), "versions", "-o", "json"], capture_output=True, text=True,
                       cwd=tmp_path, timeout=120)
    assert r.returncode == 0 and json.loads(r.stdout), r.stdout + r.stderr
