"""Playbook files: a named list of steps, each with a condition, a done-test, commands, and what it changes.

A step is either commands (`check` + `run`) or a file (`file: {path, content, mode}`), whose check and
atomic write gpuk8s derives itself. Every string is a jinja2 template rendered against one host.

What several playbooks (or a step's check and its run) have in common is written once, in
playbooks/_shared.yaml: a step takes a shared step with `use: NAME` and fills in its `params`, and any template
takes a shared block with `{% include 'NAME' %}` (playbooks/README.md, "Shared steps and blocks"). Both are
resolved and checked here, when a playbook is loaded, so that a wrong name or a missing param fails at once,
naming the playbook and the step, not on the first host where the step applies.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field, replace
from importlib import resources
from typing import Any, TypeGuard

import jinja2
import jinja2.meta
import yaml

from gpuk8s.errors import GpuK8sError

_NAME = re.compile(r"^[a-z0-9][a-z0-9-]*$")
_PARAM = re.compile(r"^[a-z][a-z0-9_]*$")  # a param is `params.NAME` in a template: an identifier
_STEP_KEYS = {"name", "title", "when", "check", "run", "file", "changes", "restarts", "use", "params"}
# a step with `use:` says where it applies and what it is called; what it does comes from the shared step
_USING_KEYS = {"name", "title", "when", "changes", "restarts", "use", "params"}
# a shared step has no `when` (each step that uses it says where it applies) and uses no other shared step
_SHARED_STEP_KEYS = {"name", "title", "check", "run", "file", "changes", "restarts", "params"}
SHARED = "_shared"  # playbooks/_shared.yaml: not a playbook (playbook_names leaves out names starting with _)
SHARED_SOURCE = f"playbooks/{SHARED}.yaml"

ParamValue = str | bool | int | float


# gpuk8s's own files, read on every install and join: libyaml's loader where PyYAML has it (the pure-Python one
# took ~140 ms a run for the playbooks)
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _load_yaml(text: str) -> Any:
    return yaml.load(text, Loader=_LOADER)  # noqa: S506 (a safe loader: CSafeLoader or SafeLoader)


class PlaybookError(GpuK8sError):
    """A playbook file is malformed: a bug in gpuk8s (or a user's edited copy), reported with its location."""

    kind = "playbook"


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
    use: str = ""  # the shared step whose templates these are ("" for a step written out in its playbook)
    params: tuple[tuple[str, ParamValue], ...] = ()  # `params.NAME` in those templates, defaults filled in


@dataclass(frozen=True)
class Playbook:
    name: str
    description: str
    steps: tuple[Step, ...] = field(default_factory=tuple)


@dataclass(frozen=True)
class SharedStep:
    step: Step  # the templates; its name is the shared step's name
    params: tuple[tuple[str, ParamValue | None], ...] = ()  # what it takes, with defaults (None: required)


@dataclass(frozen=True)
class Shared:
    """playbooks/_shared.yaml: shared steps by name, and shared blocks (template text) by name."""

    steps: dict[str, SharedStep] = field(default_factory=dict)
    blocks: dict[str, str] = field(default_factory=dict)


def _document(text: str, source: str) -> dict[str, Any]:
    try:
        doc = _load_yaml(text)
    except yaml.YAMLError as e:
        raise PlaybookError(f"{source}: not valid YAML: {e}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("steps"), list):
        raise PlaybookError(f"{source}: expected a mapping with 'name', 'description' and a 'steps' list")
    return doc


def _step(raw: dict[str, Any], where: str, name: str, title: str) -> Step:
    """The parts every step has, checked the same way in a playbook and in the shared file."""
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
    return Step(
        name=name, title=str(raw.get("title", title)), when=str(raw.get("when", "") or ""),
        check=str(raw.get("check", "") or ""), run=str(raw.get("run", "") or ""), file=spec,
        changes=_changes(raw, where, name), restarts=str(raw.get("restarts", "") or ""),
    )


def _changes(raw: dict[str, Any], where: str, name: str) -> tuple[str, ...]:
    changes = raw.get("changes", [])
    if not isinstance(changes, list):
        raise PlaybookError(f"{where} ({name}): 'changes' must be a list")
    return tuple(str(c) for c in changes)


def _steps(doc: dict[str, Any], source: str, keys: set[str]) -> list[tuple[str, str, dict[str, Any]]]:
    """(where, name, raw) of each step: a mapping of known keys with a unique, well-formed name."""
    out = []
    seen: set[str] = set()
    for i, raw in enumerate(doc["steps"]):
        where = f"{source}: step {i + 1}"
        if not isinstance(raw, dict):
            raise PlaybookError(f"{where}: expected a mapping")
        unknown = set(raw) - keys
        if unknown:
            raise PlaybookError(f"{where}: unknown keys {sorted(unknown)}; allowed: {sorted(keys)}")
        name = str(raw.get("name", ""))
        if not _NAME.match(name) or name in seen:
            raise PlaybookError(f"{where}: name {name!r} must be unique, lowercase letters, digits and '-'")
        seen.add(name)
        out.append((where, name, raw))
    return out


def _is_value(v: object) -> TypeGuard[ParamValue]:
    return isinstance(v, (str, bool, int, float))


def _using(raw: dict[str, Any], where: str, name: str, shared: Shared) -> Step:
    """A step made from a shared step: its own name, title, when (and changes, restarts, if it gives them),
    the shared step's templates, and every param the shared step takes."""
    use = raw["use"]
    if not isinstance(use, str) or use not in shared.steps:
        raise PlaybookError(f"{where} ({name}): use: {use!r} is no shared step of {SHARED_SOURCE} "
                            f"(it has: {', '.join(sorted(shared.steps)) or 'none'})")
    own = set(raw) - _USING_KEYS
    if own:
        raise PlaybookError(f"{where} ({name}): takes {', '.join(sorted(own))} from the shared step {use!r} "
                            f"(use: {use}); a step with use: may give only {sorted(_USING_KEYS)}")
    given = raw.get("params") or {}
    if not isinstance(given, dict):
        raise PlaybookError(f"{where} ({name}): params must be a mapping of NAME: value")
    sh = shared.steps[use]
    takes = dict(sh.params)
    unknown = sorted(set(map(str, given)) - set(takes))
    if unknown:
        raise PlaybookError(f"{where} ({name}): use: {use} takes no param {', '.join(unknown)} "
                            f"(it takes: {', '.join(takes) or 'none'})")
    missing = [k for k, default in takes.items() if default is None and given.get(k) is None]
    if missing:
        raise PlaybookError(f"{where} ({name}): use: {use} needs the param(s) {', '.join(missing)}")
    params: list[tuple[str, ParamValue]] = []
    for k, default in sh.params:
        v = given.get(k, default)
        if not _is_value(v):
            raise PlaybookError(f"{where} ({name}): param {k} must be a string, a number or true/false")
        params.append((k, v))
    return replace(sh.step, name=name, title=str(raw.get("title") or sh.step.title or name),
                   when=str(raw.get("when", "") or ""),
                   changes=_changes(raw, where, name) if "changes" in raw else sh.step.changes,
                   restarts=str(raw.get("restarts", "") or sh.step.restarts),
                   use=use, params=tuple(params))


def _included(template: str, where: str) -> set[str]:
    """The blocks a template takes with {% include %}."""
    if "include" not in template:  # nearly every template: not parsed here (render.py compiles it, once)
        return set()
    try:
        names = set(jinja2.meta.find_referenced_templates(jinja2.Environment().parse(template)))
    except jinja2.TemplateSyntaxError as e:
        raise PlaybookError(f"{where}: {e}") from None
    if None in names:
        raise PlaybookError(f"{where}: include names its block as a quoted string, {{% include 'NAME' %}}")
    return {str(n) for n in names}


def _templates(step: Step) -> list[str]:
    return [step.title, step.check, step.run, *step.changes, *(
        (step.file.path, step.file.content) if step.file else ())]


def _check_includes(step: Step, where: str, blocks: dict[str, str] | None) -> None:
    for t in _templates(step):
        names = _included(t, f"{where} ({step.name})")
        if not names:
            continue
        known = load_shared().blocks if blocks is None else blocks
        missing = sorted(names - set(known))
        if missing:
            raise PlaybookError(f"{where} ({step.name}): include {missing[0]!r}: no such block in {SHARED_SOURCE} "
                                f"(it has: {', '.join(sorted(known)) or 'none'})")


def parse_playbook(text: str, source: str) -> Playbook:
    """Read one playbook document; every structural mistake is a PlaybookError naming the step."""
    doc = _document(text, source)
    steps = []
    for where, name, raw in _steps(doc, source, _STEP_KEYS):
        if "use" in raw:
            step = _using(raw, where, name, load_shared())
        elif "params" in raw:
            raise PlaybookError(f"{where} ({name}): params go with use: (a shared step of {SHARED_SOURCE})")
        else:
            step = _step(raw, where, name, name)
        _check_includes(step, where, None)
        steps.append(step)
    return Playbook(str(doc.get("name", source)), str(doc.get("description", "")), tuple(steps))


def parse_shared(text: str, source: str = SHARED_SOURCE) -> Shared:
    """Read the shared file: `steps` (each declaring its `params`, NAME: default, no default = required) and
    `blocks` (NAME: template text; a block includes no other block, so that no include can loop)."""
    doc = _document(text, source)
    blocks = doc.get("blocks") or {}
    if not isinstance(blocks, dict) or not all(isinstance(k, str) and _NAME.match(k) and isinstance(v, str)
                                               for k, v in blocks.items()):
        raise PlaybookError(f"{source}: blocks must map names (lowercase letters, digits and '-') to text")
    for k, v in blocks.items():
        if _included(v, f"{source}: block {k}"):
            raise PlaybookError(f"{source}: block {k}: a block includes no other block")
    steps = {}
    for where, name, raw in _steps(doc, source, _SHARED_STEP_KEYS):
        declared = raw.get("params") or {}
        if not isinstance(declared, dict) or not all(isinstance(k, str) and _PARAM.match(k) for k in declared):
            raise PlaybookError(f"{where} ({name}): params must map names (a-z, digits, _) to defaults "
                                "(none for a required param)")
        for k, v in declared.items():
            if v is not None and not _is_value(v):
                raise PlaybookError(f"{where} ({name}): param {k}: a default is a string, a number or true/false")
        step = _step(raw, where, name, "")
        _check_includes(step, where, blocks)
        steps[name] = SharedStep(step, tuple(declared.items()))
    return Shared(steps, dict(blocks))


@functools.lru_cache(maxsize=1)
def load_shared() -> Shared:
    """The shared steps and blocks shipped with gpuk8s (read once: every playbook of a run uses them)."""
    res = resources.files("gpuk8s.playbooks").joinpath(f"{SHARED}.yaml")
    if not res.is_file():
        raise PlaybookError(f"{SHARED_SOURCE}: missing (the shared steps and blocks of the playbooks)")
    return parse_shared(res.read_text(), SHARED_SOURCE)


def load_playbook(name: str) -> Playbook:
    """A playbook shipped with gpuk8s (the top-level playbooks/ directory of the source tree)."""
    res = resources.files("gpuk8s.playbooks").joinpath(f"{name}.yaml")
    return parse_playbook(res.read_text(), f"playbooks/{name}.yaml")


def playbook_names() -> list[str]:
    # _shared.yaml holds pieces of playbooks, not a playbook
    return sorted(p.name.removesuffix(".yaml") for p in resources.files("gpuk8s.playbooks").iterdir()
                  if p.name.endswith(".yaml") and not p.name.startswith("_"))
