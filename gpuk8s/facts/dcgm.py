"""DCGM's diagnostic from its real JSON (pure): `dcgmi diag -r LEVEL -j`, the standard (-r 2) and long (-r 3) levels
of `gpuk8s health` (docs/health.md).

Two document shapes, both real (tests/fixtures/real/health/dcgm-*):
- DCGM 3.x: `{"DCGM GPU Diagnostic": {"test_categories": [{"category", "tests": [{"name", "results": [{"gpu_id" |
  "gpu_ids", "status", "warnings"?, "info"?}]}]}]}, ...}`;
- DCGM 4.x: the root key is `"DCGM Diagnostic"`, each result names its entity (`"entity_group": "GPU"`,
  `"entity_id": N`), a test may carry a `"test_summary"` with its own status, and the versions sit in `"metadata"`
  (`"version"`, `"Driver Version Detected"`).
dcgmi may print a line before the document ("Successfully ran diagnostic for group."), so the document starts at the
first `{` of a line. Statuses are compared without case ("Pass", "PASS", "pass"); an unknown word is never read as a
pass.

The text comes from a host: bounded (MAX_BYTES; json's parser is linear, and a nesting deeper than the recursion
limit is an unreadable document, not a crash), and only numbers and short cleaned strings are kept.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from gpuk8s.text import one_line

MAX_BYTES = 4 << 20  # an 8-GPU -r 3 document is ~60 KB
MAX_RESULTS = 4096  # results kept (tests x GPUs); the rest are counted
MAX_TEXT = 300  # characters kept of a warning

ROOTS = ("DCGM Diagnostic", "DCGM GPU Diagnostic")  # 4.x, 3.x
STATUSES = {"pass": "pass", "fail": "fail", "warn": "warn", "warning": "warn", "skip": "skip", "skipped": "skip",
            "not run": "not-run", "notrun": "not-run"}


@dataclass(frozen=True)
class DiagResult:
    """One test's result on one GPU (or on the GPUs a 3.x result names together)."""

    category: str
    test: str
    gpu: str  # "0", "0,1,2" (3.x gpu_ids), "" when the result names none
    status: str  # pass | fail | warn | skip | not-run | unknown
    warnings: tuple[str, ...] = ()


@dataclass(frozen=True)
class DiagReport:
    read: bool = False
    error: str = ""  # why the document could not be read
    version: str = ""
    driver: str = ""
    results: tuple[DiagResult, ...] = ()
    more: int = 0  # results past MAX_RESULTS, not kept

    @property
    def failed(self) -> list[DiagResult]:
        return [r for r in self.results if r.status in ("fail", "unknown")]

    @property
    def warned(self) -> list[DiagResult]:
        return [r for r in self.results if r.status == "warn"]


def _text(v: Any) -> str:
    if isinstance(v, bool) or not isinstance(v, str | int | float):
        return ""
    return one_line(str(v)).strip()[:MAX_TEXT]


def _status(v: Any) -> str:
    return STATUSES.get(_text(v).lower(), "unknown")


def _list(v: Any) -> list[Any]:
    """A JSON array as a list; anything else (a number, an object, null) as empty: the document is a host's."""
    return v if isinstance(v, list) else []


def _warnings(result: dict[str, Any]) -> tuple[str, ...]:
    out = []
    for w in _list(result.get("warnings")):
        text = _text(w.get("warning")) if isinstance(w, dict) else _text(w)
        if text:
            out.append(text)
    return tuple(out[:8])


def _gpu(result: dict[str, Any]) -> str:
    if "entity_id" in result:
        group = _text(result.get("entity_group")) or "GPU"
        return _text(result["entity_id"]) if group == "GPU" else f"{group} {_text(result['entity_id'])}"
    return _text(result.get("gpu_id", result.get("gpu_ids", "")))


def _document(text: str) -> Any:
    """The JSON document in dcgmi's output: from the first line that starts with '{'."""
    if text.lstrip().startswith("{"):
        return json.loads(text)
    at = text.find("\n{")
    if at < 0:
        raise ValueError("no JSON document in dcgmi's output")
    return json.loads(text[at + 1:])


def parse_diag(text: str) -> DiagReport:
    """A DiagReport of `dcgmi diag -j`'s output; read=False with the reason when it is not a diagnostic document."""
    if len(text) > MAX_BYTES:
        return DiagReport(error=f"dcgmi printed more than {MAX_BYTES >> 20} MiB: not read")
    try:
        doc = _document(text)
    except (ValueError, RecursionError) as e:
        first = next((ln for ln in text.splitlines() if ln.strip()), "no output")
        return DiagReport(error=f"not a diagnostic document ({type(e).__name__}): {_text(first)}")
    root = next((doc[k] for k in ROOTS if isinstance(doc, dict) and isinstance(doc.get(k), dict)), None)
    if root is None:
        return DiagReport(error="no 'DCGM Diagnostic' (4.x) or 'DCGM GPU Diagnostic' (3.x) object in the document")
    meta = doc["metadata"] if isinstance(doc.get("metadata"), dict) else root
    version = _text(meta.get("version") or root.get("version") or "")
    driver = _text(meta.get("Driver Version Detected") or root.get("Driver Version Detected")
                   or root.get("driver_version_detected") or "")
    results: list[DiagResult] = []
    more = 0
    for cat in _list(root.get("test_categories")):
        if not isinstance(cat, dict):
            continue
        category = _text(cat.get("category"))
        for test in _list(cat.get("tests")):
            if not isinstance(test, dict):  # 3.x's NVVS layer leaves nulls between tests
                continue
            name = _text(test.get("name"))
            rows = [r for r in _list(test.get("results")) if isinstance(r, dict)]
            summary = test.get("test_summary")
            # a test judged as a whole, or whose summary fails it where no GPU's result does: the summary counts
            # too (a failure said only there is still a failure)
            if isinstance(summary, dict) and (not rows or (
                    _status(summary.get("status")) in ("fail", "unknown") and "status" in summary
                    and not any(_status(r.get("status")) in ("fail", "unknown") for r in rows))):
                rows.append({"status": summary.get("status"), "warnings": summary.get("warnings")})
            for r in rows:
                if len(results) >= MAX_RESULTS:
                    more += 1
                    continue
                results.append(DiagResult(category, name, _gpu(r), _status(r.get("status")), _warnings(r)))
    if not results:
        # a diagnostic that could not run: {"DCGM Diagnostic": {"version": ..., "runtime_error": ...}} (dcgmi/Diag.cpp)
        why = _text(root.get("runtime_error")) or "the document lists no test result"
        return DiagReport(error=why, version=version, driver=driver)
    return DiagReport(True, "", version, driver, tuple(results), more)
