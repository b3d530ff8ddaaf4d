"""YAML gpuk8s did not write, read as plain data: bounded in size, without anchors or aliases, shallow.

`yaml.safe_load` runs no code, but it is not safe from time: an alias is a reference, so a "billion laughs"
document of a few hundred bytes loads at once and then expands when anything walks it (`str()`, `==`, a dump):
nine aliases per level multiply the work by nine per level. Nesting deeper than Python's recursion limit raises
RecursionError from the composer. A host's file (a control plane's static pod manifest) or a local file edited by
other tools (~/.kube/config) may be either.

`check` reads the document's events once (libyaml's parser when PyYAML has it: linear time, no recursion) and
refuses a text larger than its bound, any anchor or alias, and nesting deeper than its bound, with the line;
`load` then loads what passed. Neither error quotes the text: it may hold a private key.
"""

from __future__ import annotations

from typing import Any

import yaml

from gpuk8s.errors import GpuK8sError

MAX_DEPTH = 64  # nesting of mappings and sequences (a kubeconfig or a static pod manifest: under 10)
_Parser: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class PlainYAMLError(GpuK8sError, ValueError):
    """The text is not plain YAML data: `reason` says why (no content quoted), `line` where (1-based, 0: none)."""

    kind = "yaml"

    def __init__(self, reason: str, line: int = 0) -> None:
        super().__init__(reason + (f" (line {line})" if line else ""))
        self.reason = reason
        self.line = line


def check(text: str, max_bytes: int, max_depth: int = MAX_DEPTH) -> None:
    """Raise PlainYAMLError when `text` is longer than `max_bytes` characters, uses an anchor or an alias, or
    nests deeper than `max_depth`; yaml.YAMLError when it is not YAML. Stops at the first problem."""
    if len(text) > max_bytes:
        raise PlainYAMLError(f"is larger than {_size(max_bytes)}")
    depth = 0
    for event in yaml.parse(text, Loader=_Parser):
        line = event.start_mark.line + 1 if event.start_mark is not None else 0
        if isinstance(event, yaml.AliasEvent):
            raise PlainYAMLError("uses a YAML alias (*name)", line)
        if isinstance(event, yaml.NodeEvent) and event.anchor is not None:
            raise PlainYAMLError("uses a YAML anchor (&name)", line)
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > max_depth:
                raise PlainYAMLError(f"nests deeper than {max_depth} levels", line)
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1


def load(text: str, max_bytes: int, max_depth: int = MAX_DEPTH) -> Any:
    """`text` loaded with a safe loader after `check` passed it (None for an empty document)."""
    check(text, max_bytes, max_depth)
    return yaml.load(text, Loader=_Parser)  # noqa: S506 (a safe loader: CSafeLoader or SafeLoader)


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 and not n % (1 << 20) else f"{n >> 10} KiB" if n >= 1024 else f"{n} bytes"
