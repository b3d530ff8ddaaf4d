"""Commands that talk to hosts (and `versions`, which shows what they install), registered on the typer app by the
CLI."""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Sequence
from typing import Any

import typer

# The order of `gpuk8s --help`: the main job, then day two, then what shows versions and images.
MODULES = ("preflight", "install", "cluster", "status", "doctor", "health", "monitoring", "reset", "upgrade", "driver",
           "allocator", "kubeconfig", "versions", "images", "bundle")
# Which module registers each command. `gpuk8s preflight` imports the preflight command's module only, not every
# command's (Jinja, prometheus-client, the install phases): a run's start is most of a small fleet's client
# cost (docs/performance.md). tests/unit/test_cli_startup.py checks this table against what the modules register.
COMMANDS = {"preflight": "preflight", "install": "install", "join": "cluster", "verify": "cluster",
            "render": "cluster", "status": "status", "doctor": "doctor", "health": "health", "monitoring": "monitoring",
            "reset": "reset", "upgrade": "upgrade", "driver": "driver", "allocator": "allocator",
            "kubeconfig": "kubeconfig",
            "versions": "versions", "images": "images", "bundle": "bundle"}


def command_named(argv: Sequence[str]) -> str | None:
    """The command a command line runs: its first word that is not an option (the root's options, --verbose and
    --version, take no value), or None."""
    for word in argv:
        if word == "--":
            return None
        if not word.startswith("-"):
            return word
    return None


def register(app: typer.Typer, load_inventory: Callable[..., Any], argv: Sequence[str] | None = None) -> None:
    """Register the commands on the app: every command's module, or with `argv` (the command line after the
    program's name) only the module of the command it names, when it names one and no shell completion is
    asked for (completion lists every command)."""
    name = command_named(argv) if argv is not None else None
    completing = any(k.endswith("_COMPLETE") and k.startswith("_") for k in os.environ)
    wanted = (COMMANDS[name],) if name in COMMANDS and not completing else MODULES
    for module in wanted:
        importlib.import_module(f"gpuk8s.commands.{module}").register(app, load_inventory)
