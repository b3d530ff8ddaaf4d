"""Terminal output: rich tables on a terminal, plain lines when piped, JSON on request."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.table import Table

from gpuk8s.inventory.model import Problem


def is_terminal() -> bool:
    return sys.stdout.isatty() and os.environ.get("TERM") != "dumb"


def console(stderr: bool = False) -> Console:
    # rich honours NO_COLOR itself; off a terminal we never emit styling or box drawing.
    return Console(stderr=stderr, highlight=False, soft_wrap=not is_terminal())


def emit_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=False) + "\n")
    sys.stdout.flush()


def table(title: str, columns: Sequence[str], rows: Sequence[Sequence[str]], styles: Sequence[str] = ()) -> None:
    """A rich table on a terminal; tab-separated lines with a header otherwise."""
    if is_terminal():
        t = Table(title=title, title_justify="left")
        for c in columns:
            t.add_column(c)
        for i, r in enumerate(rows):
            t.add_row(*r, style=styles[i] if i < len(styles) else None)
        console().print(t)
    else:
        out = sys.stdout
        out.write(f"# {title}\n")
        out.write("\t".join(columns) + "\n")
        for r in rows:
            out.write("\t".join(str(c).replace("\n", " ") for c in r) + "\n")
        out.flush()


def print_problems(problems: Sequence[Problem]) -> None:
    err = console(stderr=True)
    for p in problems:
        style = "red" if p.severity == "error" else "yellow"
        err.print(str(p), style=style, markup=False)
    n_err = sum(1 for p in problems if p.severity == "error")
    n_warn = len(problems) - n_err
    if n_err:
        err.print(f"{n_err} error(s), {n_warn} warning(s): nothing was done.", markup=False)


def problems_json(problems: Sequence[Problem]) -> list[dict[str, Any]]:
    return [
        {"file": p.file, "line": p.line, "column": p.column, "key": p.key, "severity": p.severity,
         "message": p.message, "fix": p.fix}
        for p in problems
    ]
