"""Playbook files: a named list of steps, each with a condition, a done-test, commands, and what it changes.

A step is either commands (`check` + `run`) or a file (`file: {path, content, mode}`), whose check and
atomic write gpuk8s derives itself. Every string is a jinja2 template rendered against one host.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from importlib import resources

import yaml

_NAME = re.compile(r"^[a-z0-9][a-z0-9-]*$")
_STEP_KEYS = {"name", "title", "when", "check", "run", "file", "changes", "restarts"}


class PlaybookError(Exception):
    """A playbook file is malformed: a bug in gpuk8s (or a user's edited copy), reported with its location."""


@dataclass(frozen=True)
class FileSpec:
    path: str
    content: str
    mode: str = "0644"


@dataclass(frozen=True)
class Step:
    name: str
    title: str
    when: str = ""
    check: str = ""
    run: str = ""
    file: FileSpec | None = None
    changes: tuple[str, ...] = ()
    restarts: str = ""  # a service to restart once after this step changed something


@dataclass(frozen=True)
class Playbook:
    name: str
    description: str
    steps: tuple[Step, ...] = field(default_factory=tuple)


def parse_playbook(text: str, source: str) -> Playbook:
    """Read one playbook document; every structural mistake is a PlaybookError naming the step."""
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise PlaybookError(f"{source}: not valid YAML: {e}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("steps"), list):
        raise PlaybookError(f"{source}: expected a mapping with 'name', 'description' and a 'steps' list")
    steps = []
    seen: set[str] = set()
    for i, raw in enumerate(doc["steps"]):
        where = f"{source}: step {i + 1}"
        if not isinstance(raw, dict):
            raise PlaybookError(f"{where}: expected a mapping")
        unknown = set(raw) - _STEP_KEYS
        if unknown:
            raise PlaybookError(f"{where}: unknown keys {sorted(unknown)}; allowed: {sorted(_STEP_KEYS)}")
        name = str(raw.get("name", ""))
        if not _NAME.match(name) or name in seen:
            raise PlaybookError(f"{where}: name {name!r} must be unique, lowercase letters, digits and '-'")
        seen.add(name)
        f = raw.get("file")
        spec = None
        if f is not None:
            if not isinstance(f, dict) or not {"path", "content"} <= set(f) or set(f) - {"path", "content", "mode"}:
                raise PlaybookError(f"{where} ({name}): file needs path and content (and optionally mode)")
            if raw.get("check") or raw.get("run"):
                raise PlaybookError(f"{where} ({name}): a file step has no check or run of its own")
            spec = FileSpec(str(f["path"]), str(f["content"]), str(f.get("mode", "0644")))
        elif not (raw.get("check") and raw.get("run")):
            raise PlaybookError(f"{where} ({name}): a command step needs both 'check' and 'run'")
        changes = raw.get("changes", [])
        if not isinstance(changes, list):
            raise PlaybookError(f"{where} ({name}): 'changes' must be a list")
        steps.append(Step(
            name=name, title=str(raw.get("title", name)), when=str(raw.get("when", "") or ""),
            check=str(raw.get("check", "") or ""), run=str(raw.get("run", "") or ""), file=spec,
            changes=tuple(str(c) for c in changes), restarts=str(raw.get("restarts", "") or ""),
        ))
    return Playbook(str(doc.get("name", source)), str(doc.get("description", "")), tuple(steps))


def load_playbook(name: str) -> Playbook:
    """A playbook shipped with gpuk8s (the top-level playbooks/ directory of the source tree)."""
    res = resources.files("gpuk8s.playbooks").joinpath(f"{name}.yaml")
    return parse_playbook(res.read_text(), f"playbooks/{name}.yaml")


def playbook_names() -> list[str]:
    return sorted(p.name.removesuffix(".yaml") for p in resources.files("gpuk8s.playbooks").iterdir()
                  if p.name.endswith(".yaml"))


