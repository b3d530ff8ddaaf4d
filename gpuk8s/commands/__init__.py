"""Commands that talk to hosts (and `versions`, which shows what they install), registered on the typer app by the
CLI."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import typer


def register(app: typer.Typer, load_inventory: Callable[..., Any]) -> None:
    from gpuk8s.commands import cluster, install, preflight, versions

    preflight.register(app, load_inventory)
    install.register(app, load_inventory)
    cluster.register(app, load_inventory)
    versions.register(app, load_inventory)
    __import__("gpuk8s.commands.monitoring", fromlist=["register"]).register(app, load_inventory)
    __import__("gpuk8s.commands.kubeconfig", fromlist=["register"]).register(app, load_inventory)
    __import__("gpuk8s.commands.reset", fromlist=["register"]).register(app, load_inventory)
    __import__("gpuk8s.commands.upgrade", fromlist=["register"]).register(app, load_inventory)
    __import__("gpuk8s.commands.status", fromlist=["register"]).register(app, load_inventory)
    __import__("gpuk8s.commands.images", fromlist=["register"]).register(app, load_inventory)
    __import__("gpuk8s.commands.doctor", fromlist=["register"]).register(app, load_inventory)
