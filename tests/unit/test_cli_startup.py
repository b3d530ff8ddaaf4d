"""A command's start imports what that command needs, not every command's modules (docs/performance.md: the start
is most of a small fleet's client cost), and the table that says which module registers which command is right."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys

import pytest
import typer

from gpuk8s import commands


def _names(app: typer.Typer) -> list[str]:
    """The commands and command groups (`gpuk8s driver ...`) registered on the app."""
    return [*(c.name or c.callback.__name__ for c in app.registered_commands if c.callback is not None),
            *(g.name for g in app.registered_groups if g.name)]


def test_the_table_names_each_command_by_the_module_that_registers_it() -> None:
    seen: dict[str, str] = {}
    for module in commands.MODULES:
        app = typer.Typer()
        importlib.import_module(f"gpuk8s.commands.{module}").register(app, lambda *a: None)
        for name in _names(app):
            seen[name] = module
    assert seen == commands.COMMANDS


@pytest.mark.parametrize(("argv", "wanted"), [
    (["preflight", "-i", "inv.yaml"], "preflight"),
    (["-v", "verify", "--kubeconfig", "k"], "verify"),
    (["--verbose", "install"], "install"),
    (["--help"], None),
    ([], None),
    (["--", "preflight"], None),
])
def test_the_command_a_command_line_names(argv: list[str], wanted: str | None) -> None:
    assert commands.command_named(argv) == wanted


def _imported_after_registering(argv: list[str]) -> list[str]:
    code = ("import json, sys\nfrom gpuk8s import cli\ncli._register_commands(json.loads(sys.argv[1]))\n"
            "print(json.dumps(sorted(m for m in sys.modules if m.startswith(('gpuk8s.commands.', "
            "'prometheus_client', 'gpuk8s.install', 'gpuk8s.phases', 'gpuk8s.flows')))))\n"
            "print(json.dumps(sorted([*(c.name or c.callback.__name__ for c in cli.app.registered_commands), "
            "*(g.name for g in cli.app.registered_groups if g.name != 'inventory')])))")
    env = {k: v for k, v in __import__("os").environ.items() if not k.endswith("_COMPLETE")}
    out = subprocess.run([sys.executable, "-c", code, json.dumps(argv)], capture_output=True, text=True,
                         check=True, env=env).stdout.splitlines()
    return json.loads(out[0]) + ["commands:"] + json.loads(out[1])


def test_preflight_imports_its_own_command_only() -> None:
    got = _imported_after_registering(["preflight", "-i", "inventory.yaml"])
    mods = got[:got.index("commands:")]
    # not the other commands, prometheus-client, the install phases (preflight renders the manifests: Jinja it needs)
    assert mods == ["gpuk8s.commands.common", "gpuk8s.commands.preflight"]
    assert got[got.index("commands:") + 1:] == ["preflight"]


def test_help_and_an_unknown_word_register_every_command() -> None:
    for argv in (["--help"], ["no-such-command"]):
        got = _imported_after_registering(argv)
        assert set(commands.COMMANDS) <= set(got[got.index("commands:") + 1:])
