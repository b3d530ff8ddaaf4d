"""Terminal output: rich tables on a terminal, plain lines when piped, JSON on request.

Text from hosts (and anything else shown) goes through `safe`: control characters removed, secrets
masked, and rendered as a rich `Text`, never parsed as markup, so a GPU name like `[/bold]` or an
escape sequence from a host is shown literally and can neither crash rich nor drive the terminal.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterable, Sequence
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from gpuk8s.inventory.model import Problem
from gpuk8s.logs import mask
from gpuk8s.text import clean, one_line


def is_terminal() -> bool:
    return sys.stdout.isatty() and os.environ.get("TERM") != "dumb"


def console(stderr: bool = False) -> Console:
    # rich honours NO_COLOR itself; off a terminal we never emit styling or box drawing. Markup and emoji
    # codes are off: a string printed by mistake is shown as it is, never interpreted.
    return Console(stderr=stderr, highlight=False, markup=False, emoji=False, soft_wrap=not is_terminal())


def safe(text: object, style: str = "", single_line: bool = False) -> Text:
    """`text` ready to show: control characters removed, secrets masked, as a `Text` (never markup)."""
    s = str(text)
    return Text(mask(one_line(s) if single_line else clean(s)), style=style)


def say(con: Console, text: object, style: str | None = None) -> None:
    """Print one message that may hold host text (see `safe`)."""
    con.print(safe(text, style or ""))


def _safe_json(data: Any) -> Any:
    if isinstance(data, str):
        return mask(clean(data))
    if isinstance(data, dict):
        return {_safe_json(k): _safe_json(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [_safe_json(v) for v in data]
    return data


class _Unsupported(Exception):
    """A value _json_text does not write itself: emit_json falls back to json.dumps, which decides."""


_FLOAT_SPECIAL = {float("inf"): "Infinity", float("-inf"): "-Infinity"}


def _json_text(data: Any, indent: str = "", memo: dict[str, str] | None = None) -> str:
    """`json.dumps(_safe_json(data), indent=2)`, byte for byte, in one walk; with `indent`, the text of `data` as a
    value nested at that indentation (its first line not indented: it follows a key or a list's separator).

    Every string (keys too) is cleaned and masked once per distinct value (a report repeats the same
    keys, ids and facts on every host), then escaped by json's C escaper; the indented layout is written
    here, because json's own indented encoder is pure Python and walks the data a second time.
    """
    esc = json.encoder.encode_basestring_ascii
    memo = {} if memo is None else memo  # a string's JSON text, cleaned and masked: shared by a streamed report's hosts
    seps: dict[str, tuple[str, str, str, str]] = {}  # indent -> its separators, made once
    blocks: list[str] = []  # the text so far, in blocks of a few thousand pieces (fewer small objects)
    out: list[str] = []

    def put(piece: str) -> None:
        out.append(piece)
        if len(out) >= 4096:
            blocks.append("".join(out))
            out.clear()

    def sep_of(ind: str) -> tuple[str, str, str, str]:
        r = seps.get(ind)
        if r is None:
            inner = ind + "  "
            r = seps[ind] = (inner, "\n" + inner, ",\n" + inner, "\n" + ind)
        return r

    def string(s: str) -> str:
        r = memo.get(s)
        if r is None:
            r = memo[s] = esc(mask(clean(s)))
        return r

    def key(k: Any) -> str:
        if isinstance(k, str):
            return string(k)
        if k is True:
            return '"true"'
        if k is False:
            return '"false"'
        if k is None:
            return '"null"'
        if isinstance(k, int):
            return '"' + int.__repr__(k) + '"'
        raise _Unsupported  # float keys and anything else: json.dumps decides

    def value(o: Any, ind: str) -> None:
        if isinstance(o, str):
            put(string(o))
        elif o is None:
            put("null")
        elif o is True:
            put("true")
        elif o is False:
            put("false")
        elif isinstance(o, int):
            put(int.__repr__(o))
        elif isinstance(o, float):
            if o != o or o in _FLOAT_SPECIAL:
                put("NaN" if o != o else _FLOAT_SPECIAL[o])
            else:
                put(float.__repr__(o))
        elif isinstance(o, dict):
            if not o:
                put("{}")
                return
            keys = [key(k) for k in o]
            if len(set(keys)) != len(keys):
                raise _Unsupported  # keys that clean or mask made equal: _safe_json keeps the last value
            inner, first, sep, close = sep_of(ind)
            put("{")
            put(first)
            for i, (k, v) in enumerate(zip(keys, o.values(), strict=True)):
                if i:
                    put(sep)
                put(k)
                put(": ")
                value(v, inner)
            put(close)
            put("}")
        elif isinstance(o, (list, tuple)):
            if not o:
                put("[]")
                return
            inner, first, sep, close = sep_of(ind)
            put("[")
            put(first)
            for i, v in enumerate(o):
                if i:
                    put(sep)
                value(v, inner)
            put(close)
            put("]")
        else:
            raise _Unsupported

    value(data, indent)
    blocks.append("".join(out))
    return "".join(blocks)


class LazyList:
    """A JSON list whose items are made one at a time as emit_json_stream writes them (a report of 512 hosts: each
    host's object built, written and dropped, never the whole report in memory)."""

    def __init__(self, items: Iterable[Any]) -> None:
        self.items = items


def _nested(data: Any, indent: str, memo: dict[str, str]) -> str:
    try:
        return _json_text(data, indent, memo)
    except (_Unsupported, RecursionError):
        return json.dumps(_safe_json(data), indent=2, sort_keys=False).replace("\n", "\n" + indent)


def emit_json_stream(fields: Sequence[tuple[str, Any]]) -> None:
    """A JSON object of `fields` (key, value) on stdout, byte for byte what emit_json of the dict writes, a LazyList
    value written item by item."""
    out = sys.stdout
    if not fields:
        out.write("{}\n")
        out.flush()
        return
    out.write("{\n")
    memo: dict[str, str] = {}
    for i, (k, v) in enumerate(fields):
        out.write((",\n  " if i else "  ") + json.encoder.encode_basestring_ascii(mask(clean(k))) + ": ")
        if isinstance(v, LazyList):
            first = True
            for item in v.items:
                out.write("[\n    " if first else ",\n    ")
                out.write(_nested(item, "    ", memo))
                first = False
            out.write("[]" if first else "\n  ]")
        else:
            out.write(_nested(v, "  ", memo))
    out.write("\n}\n")
    out.flush()


def emit_json(data: Any) -> None:
    try:
        text = _json_text(data)
    except (_Unsupported, RecursionError):
        # Anything unusual (an object json cannot write, a cycle): json.dumps raises or writes it as before.
        text = json.dumps(_safe_json(data), indent=2, sort_keys=False)
    sys.stdout.write(text)
    sys.stdout.write("\n")
    sys.stdout.flush()


def table(title: str, columns: Sequence[str], rows: Sequence[Sequence[object]], styles: Sequence[str] = ()) -> None:
    """A rich table on a terminal; tab-separated lines with a header otherwise. Cells are shown as text."""
    if is_terminal():
        t = Table(title=safe(title, single_line=True), title_justify="left")
        for c in columns:
            t.add_column(safe(c, single_line=True))
        for i, r in enumerate(rows):
            t.add_row(*(safe(c) for c in r), style=styles[i] if i < len(styles) else None)
        console().print(t)
    else:
        out = sys.stdout
        out.write(f"# {mask(one_line(title))}\n")
        out.write("\t".join(mask(one_line(c)) for c in columns) + "\n")
        for r in rows:
            out.write("\t".join(mask(one_line(str(c))) for c in r) + "\n")
        out.flush()


def print_problems(problems: Sequence[Problem]) -> None:
    err = console(stderr=True)
    for p in problems:
        say(err, p, "red" if p.severity == "error" else "yellow")
    n_err = sum(1 for p in problems if p.severity == "error")
    n_warn = len(problems) - n_err
    if n_err:
        say(err, f"{n_err} error(s), {n_warn} warning(s): nothing was done.")


def problems_json(problems: Sequence[Problem]) -> list[dict[str, Any]]:
    return [
        {"file": p.file, "line": p.line, "column": p.column, "key": p.key, "severity": p.severity,
         "message": p.message, "fix": p.fix}
        for p in problems
    ]
