"""`gpuk8s inventory import FILE`: a Kubespray/Ansible inventory mapped onto a gpuk8s inventory.

The mapping is gpuk8s/inventory/kubespray.py (pure); this reads the file, validates the result with the
inventory loader before writing it, never overwrites a file, and lists what it did not import by line.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import typer

from gpuk8s import ui
from gpuk8s.exitcodes import ExitCode
from gpuk8s.inventory.kubespray import KubesprayImportError, Result, convert, parse
from gpuk8s.inventory.loader import MAX_BYTES, InventoryError, load


def run(source: Path, out: Path, as_json: bool) -> None:
    err = ui.console(stderr=True)

    def fail(message: str, problems: list[dict[str, object]] | None = None) -> None:
        if as_json:
            ui.emit_json({"ok": False, "error": message, "problems": problems or []})
        else:
            ui.say(err, message, "red")
        raise typer.Exit(ExitCode.USAGE)

    try:
        with open(source, "rb") as f:
            data = f.read(MAX_BYTES + 1)
    except OSError as e:
        fail(f"cannot read {source}: {e.strerror or type(e).__name__}")
        return
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        fail(f"{source}:{line}: the file is not valid UTF-8")
        return
    try:
        result = convert(parse(text, source.name), str(source))
    except KubesprayImportError as e:
        fail(f"{source}:{e.line}: {e.message}")
        return
    if out.exists() or out.is_symlink():
        fail(f"{out} exists; not overwritten. Choose another path with -o.")
    # the written inventory must load: checked on a copy before the file is created
    with tempfile.TemporaryDirectory() as tmp:
        probe = Path(tmp) / out.name
        probe.write_text(result.text)
        try:
            load(probe)
        except InventoryError as e:
            fail(f"the imported inventory does not validate ({len(e.problems)} problem(s)); nothing written",
                 ui.problems_json(e.problems))
    try:
        with open(out, "x") as written:
            written.write(result.text)
    except FileExistsError:
        fail(f"{out} exists; not overwritten. Choose another path with -o.")
    except OSError as e:
        fail(f"cannot write {out}: {e.strerror or type(e).__name__}")
    if as_json:
        ui.emit_json({"ok": True, "written": str(out), "source": str(source), **result.to_json()})
        return
    _report(result, source, out)


def _report(result: Result, source: Path, out: Path) -> None:
    ui.table(f"Hosts imported from {source}", ["host", "address", "role", "line"],
             [[h.name, h.address, h.role, h.line] for h in result.hosts])
    if result.notes:
        ui.table(f"Not imported or changed ({len(result.notes)})", ["line", "key", "kind", "why"],
                 [[f"{source}:{n.line}", n.key, n.kind, n.message] for n in result.notes])
    ui.say(ui.console(), f"wrote {out}: {len(result.hosts)} host(s), {len(result.notes)} note(s); check it with "
                         f"'gpuk8s inventory validate -i {out}', then 'gpuk8s preflight -i {out}'")
