"""Command-line options shared by several commands."""

from enum import Enum

import typer


class Output(str, Enum):
    table = "table"
    json = "json"


InventoryOpt = typer.Option(
    None, "-i", "--inventory", help="Inventory file (default: $GPUK8S_INVENTORY, then ./inventory.yaml)."
)
OutputOpt = typer.Option(Output.table, "--output", "-o", help="table for people, json for scripts.")
