"""Commands that talk to hosts (and `versions`, which shows what they install), registered on the typer app by the
CLI."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import typer


def register(app: typer.Typer, load_inventory: Callable[..., Any]) -> None:
    from gpuk8s.commands import (
        cluster,
        doctor,
        images,
        install,
        kubeconfig,
        monitoring,
        preflight,
        reset,
        status,
        upgrade,
        versions,
    )

    # the order of `gpuk8s --help`: the main job, then day two, then what shows versions and images
    for module in (preflight, install, cluster, status, doctor, monitoring, reset, upgrade, kubeconfig, versions,
                   images):
        module.register(app, load_inventory)
