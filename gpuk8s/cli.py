"""The `gpuk8s` command line (typer)."""

from __future__ import annotations

import logging
import os
import signal
import sys
from importlib import resources
from pathlib import Path

import typer

from gpuk8s import __version__, ui, versions
from gpuk8s.exitcodes import ExitCode
from gpuk8s.inventory import Inventory, InventoryError, find_inventory, load
from gpuk8s.logs import setup_logging
from gpuk8s.options import InventoryOpt, Output, OutputOpt

app = typer.Typer(
    name="gpuk8s",
    help="Turn bare NVIDIA GPU servers into one working Kubernetes cluster.",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
)
inventory_app = typer.Typer(help="Check or create an inventory file.", no_args_is_help=True)
app.add_typer(inventory_app, name="inventory")


def _version(value: bool) -> None:
    if value:
        typer.echo(f"gpuk8s {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    ctx: typer.Context,
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Show debug detail on stderr."),
    version: bool | None = typer.Option(  # noqa: UP007 (typer needs Optional on 3.10)
        None, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    ctx.obj = {"verbose": verbose}


def load_inventory(path: Path | None, output: Output) -> Inventory:  # noqa: UP007
    """Load or exit 2 with every problem listed; warnings are shown but do not stop."""
    try:
        inv = load(find_inventory(path))
    except InventoryError as e:
        if output == Output.json:
            ui.emit_json({"valid": False, "problems": ui.problems_json(e.problems)})
        else:
            ui.print_problems(e.problems)
        raise typer.Exit(ExitCode.USAGE) from None
    if inv.warnings and output != Output.json:
        ui.print_problems(inv.warnings)
    return inv


@inventory_app.command("validate")
def inventory_validate(
    inventory: Path | None = InventoryOpt,  # noqa: UP007
    output: Output = OutputOpt,
) -> None:
    """Validate the inventory without contacting any host; exit 2 if it has errors."""
    inv = load_inventory(inventory, output)
    if output == Output.json:
        ui.emit_json({
            "valid": True,
            "problems": ui.problems_json(inv.warnings),
            "hosts": [{"name": h.name, "address": h.address, "role": h.role, "gpus": h.gpus} for h in inv.hosts],
        })
        return
    cps = len(inv.control_planes)
    ui.say(ui.console(), f"{inv.path}: valid: {len(inv.hosts)} host(s), {cps} control plane(s), "
                         f"{len(inv.workers)} worker(s)")


@inventory_app.command("init")
def inventory_init(
    path: Path = typer.Argument(Path("inventory.yaml"), help="Where to write the starter inventory."),
) -> None:
    """Write a commented starter inventory; never overwrites an existing file."""
    import jinja2  # only `inventory init` renders a template here

    template = resources.files("gpuk8s").joinpath("data/inventory-starter.yaml.j2").read_text()
    # the versions of the starter are the version matrix's defaults, never written twice
    text = jinja2.Template(template, keep_trailing_newline=True).render(
        kubernetes=versions.default_minor(), toolkit=versions.pins().toolkit)
    try:
        with open(path, "x") as f:
            f.write(text)
    except FileExistsError:
        ui.say(ui.console(stderr=True), f"{path} exists; not overwritten. Choose another path.")
        raise typer.Exit(ExitCode.USAGE) from None
    ui.say(ui.console(), f"wrote {path}: edit the hosts, then run 'gpuk8s inventory validate -i {path}'")


@inventory_app.command("import")
def inventory_import(
    source: Path = typer.Argument(..., help="A Kubespray/Ansible inventory (INI or YAML)."),
    out: Path = typer.Option(Path("inventory.yaml"), "--out", "-o", help="Where to write the gpuk8s inventory "
                             "(never overwritten)."),
    as_json: bool = typer.Option(False, "--json", help="Print the hosts and what was not imported as JSON."),
) -> None:
    """Write a gpuk8s inventory from a Kubespray/Ansible one, listing by line what it could not map."""
    from gpuk8s.commands.inventory_import import run

    run(source, out, as_json)


def _register_commands(argv: list[str] | None = None) -> None:
    # Imported here so that each command lives in its own module; with argv, only the named command's module
    from gpuk8s.commands import register

    register(app, load_inventory, argv)


class Interrupted(BaseException):
    """Raised on SIGINT instead of KeyboardInterrupt, which click would turn into exit status 1."""


def _on_sigint(signum: int, frame: object) -> None:
    raise Interrupted()


def main() -> None:
    setup_logging(verbose="-v" in sys.argv or "--verbose" in sys.argv)
    _register_commands(sys.argv[1:])
    signal.signal(signal.SIGINT, _on_sigint)
    try:
        try:
            app()
        finally:
            # the work is over (or being abandoned): a SIGINT during interpreter shutdown must not turn a
            # finished run's exit status into death by signal
            signal.signal(signal.SIGINT, signal.SIG_IGN)
    except Interrupted:
        logging.getLogger("gpuk8s").warning("interrupted by SIGINT")
        sys.stderr.write("interrupted\n")
        sys.stderr.flush()
        # worker threads may still wait on a slow host; they hold no lock we need, so leave now
        os._exit(ExitCode.INTERRUPTED)
