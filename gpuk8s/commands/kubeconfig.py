"""`gpuk8s kubeconfig`: fetch the admin kubeconfig of the cluster again, to a file of its own (0600, atomic) or
merged into the operator's kubeconfig as a named context (other entries keep their bytes; a backup is kept).

The credentials are never printed: messages and JSON name paths and contexts only.
"""

from __future__ import annotations

import os
from pathlib import Path

import typer
import yaml

from gpuk8s import ui
from gpuk8s.commands.common import passwords
from gpuk8s.exitcodes import ExitCode
from gpuk8s.inventory.model import Inventory
from gpuk8s.kube.client import ADMIN
from gpuk8s.localfiles import LocalFileError, Written, admin_kubeconfig, merge_kubeconfig, write_private
from gpuk8s.options import InventoryOpt, Output, OutputOpt
from gpuk8s.remote import RemoteError, Session


def merge_destination(env: dict[str, str] | None = None) -> Path:
    """Where kubectl reads its config: the first file of $KUBECONFIG, else ~/.kube/config."""
    env = dict(os.environ) if env is None else env
    first = next((p for p in env.get("KUBECONFIG", "").split(os.pathsep) if p), None)
    return Path(os.path.expanduser(first)) if first else Path.home() / ".kube" / "config"


def fetch(inv: Inventory, sudo: dict[str, str]) -> tuple[str, str]:
    """The admin kubeconfig of the first control plane that has one (rebuilt from kubeadm's fields only),
    and that control plane's name."""
    errors = []
    for cp in inv.control_planes:
        try:
            with Session(cp, sudo.get(cp.name)) as s:
                res = s.run(f"cat {ADMIN}", sudo=True, quiet=True)
        except RemoteError as e:
            errors.append(f"{cp.name}: {e.message}")
            continue
        if res.ok and "apiVersion" in res.stdout:
            return admin_kubeconfig(res.stdout), cp.name
        errors.append(f"{cp.name}: cannot read {ADMIN}")
    raise LocalFileError("no control plane gave its admin kubeconfig (" + "; ".join(errors) + ")",
                         "run gpuk8s install first, or check the control planes with gpuk8s preflight")


def renamed(text: str, context: str) -> str:
    """The single-context admin kubeconfig with its context called `context`."""
    cfg = yaml.safe_load(text)
    cfg["contexts"][0]["name"] = context
    cfg["current-context"] = context
    return yaml.safe_dump(cfg, sort_keys=False)


def register(app: typer.Typer, load_inventory: object) -> None:
    @app.command()
    def kubeconfig(
        inventory: Path | None = InventoryOpt,  # noqa: UP007
        output: Output = OutputOpt,
        merge: bool = typer.Option(False, "--merge", help="Merge into $KUBECONFIG's first file or ~/.kube/config "
                                   "as a context of its own, keeping every other entry (backup: FILE.gpuk8s.bak)."),
        context: str | None = typer.Option(None, "--context", help="Name of the context (default "  # noqa: UP007
                                           "CLUSTER-admin@CLUSTER with --merge, else kubeadm's)."),
        out: Path | None = typer.Option(None, "--out", help="The file to write or merge into (default "  # noqa: UP007
                                        "./CLUSTER.kubeconfig; with --merge the kubeconfig kubectl reads)."),
        force: bool = typer.Option(False, "--force", help="Replace a file (without --merge) that holds "
                                   "something else, e.g. a kubeconfig with expired certificates."),
    ) -> None:
        """Fetch the cluster's admin kubeconfig again: to a file (mode 0600) or merged as a context."""
        inv = load_inventory(inventory, output)  # type: ignore[operator]
        sudo = passwords(inv)
        con = ui.console(stderr=True)
        name = inv.cluster.name
        try:
            text, cp = fetch(inv, sudo)
            if merge:
                ctx_name = context or f"{name}-admin@{name}"
                dest = out or merge_destination()
                w: Written = merge_kubeconfig(dest, text, name, context_as=ctx_name)
            else:  # as install writes it (kubeadm's names) unless --context renames the context
                ctx_name = context or str(yaml.safe_load(text)["current-context"])
                dest = out or Path.cwd() / f"{name}.kubeconfig"
                w = write_private(dest, renamed(text, context) if context else text, force=force)
        except LocalFileError as e:
            if output == Output.json:
                ui.emit_json({"ok": False, "error": e.message, "remedy": e.remedy})
            else:
                ui.say(con, f"{e.message}; {e.remedy}" if e.remedy else e.message)
            raise typer.Exit(ExitCode.FAILED) from None
        if output == Output.json:
            ui.emit_json({"ok": True, "changed": w.changed, "status": w.status, "path": str(w.path),
                          "context": ctx_name, "control_plane": cp, "message": w.message})
        else:
            ui.say(ui.console(), f"{w.message} (from {cp}); kubectl --kubeconfig {w.path} --context {ctx_name} "
                                 "get nodes")
        raise typer.Exit(ExitCode.OK)
