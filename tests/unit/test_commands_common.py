"""gpuk8s/commands/common.py: this machine's kubectl for --kubeconfig, and the commands that use it."""

from __future__ import annotations

from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from gpuk8s.commands.common import local_kubectl
from gpuk8s.exitcodes import ExitCode
from gpuk8s.kube import client

NO_KUBECTL = ("--kubeconfig needs kubectl on this machine and there is none in PATH; install kubectl, or leave out "
              "--kubeconfig to use kubectl on the control plane")


def test_local_kubectl_uses_the_kubeconfig_and_context(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(client.shutil, "which", lambda name: "/opt/bin/kubectl" if name == "kubectl" else None)
    k = local_kubectl(tmp_path / "kc.yaml", "lab")
    assert isinstance(k, client.LocalKubectl)
    assert (k.exe, k.kubeconfig, k.context) == ("/opt/bin/kubectl", str(tmp_path / "kc.yaml"), "lab")
    assert local_kubectl(tmp_path / "kc.yaml").context is None


def test_local_kubectl_without_kubectl_is_a_usage_error(monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(client.shutil, "which", lambda name: None)
    with pytest.raises(typer.Exit) as e:
        local_kubectl(Path("kc.yaml"), "lab")
    assert e.value.exit_code == ExitCode.USAGE
    out = capsys.readouterr()
    assert out.err.strip() == NO_KUBECTL and out.out == ""


@pytest.fixture
def cli_app() -> typer.Typer:
    """The app with the host commands registered (main() does it; once per process)."""
    from gpuk8s import cli

    if not any(c.callback is not None and c.callback.__name__ == "status" for c in cli.app.registered_commands):
        cli._register_commands()
    return cli.app


@pytest.mark.parametrize("argv", [["verify", "--context", "lab"], ["status", "--context", "lab"], ["monitoring"]])
def test_commands_with_kubeconfig_and_no_kubectl_exit_2_before_any_host(
        argv: list[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path, cli_app: typer.Typer) -> None:
    monkeypatch.setattr(client.shutil, "which", lambda name: None)
    from gpuk8s.commands import common

    def no_passwords(inv: object) -> dict[str, str]:
        raise AssertionError("--kubeconfig must not ask for sudo passwords")

    for mod in ("cluster", "status", "monitoring"):
        monkeypatch.setattr(f"gpuk8s.commands.{mod}.passwords", no_passwords)
    monkeypatch.setattr(common, "passwords", no_passwords)
    inv = tmp_path / "inv.yaml"
    inv.write_text("hosts:\n  - {name: cp-1, address: 10.0.0.10, role: control-plane}\n"
                   "  - {name: gpu-1, address: 10.0.0.21}\nmonitoring: {enabled: true}\n")
    r = CliRunner().invoke(cli_app, [argv[0], "-i", str(inv), "--kubeconfig", str(tmp_path / "kc"), *argv[1:]])
    assert r.exit_code == ExitCode.USAGE, r.output
    assert NO_KUBECTL in r.output
