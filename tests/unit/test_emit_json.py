"""ui.emit_json writes exactly what json.dumps(_safe_json(data), indent=2) wrote: every string (keys too)
cleaned of control characters and masked, the same layout, the same errors for what JSON cannot hold."""

from __future__ import annotations

import io
import json
import math
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuk8s import logs, ui
from gpuk8s.logs import MASK, register_secret

SECRETS = ("hunter2-sudo", "q7", 'pa"ss\\word', "tok\nen-abcdef")


@pytest.fixture(autouse=True)
def fresh_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(logs, "_secrets", set())
    monkeypatch.setattr(logs, "_compiled", ((), None))
    for s in SECRETS:
        register_secret(s)


def _reference(data: object) -> str:
    return json.dumps(ui._safe_json(data), indent=2, sort_keys=False) + "\n"


def _emitted(data: object, monkeypatch: pytest.MonkeyPatch) -> str:
    out = io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    ui.emit_json(data)
    return out.getvalue()


_text = st.lists(st.sampled_from(list("ab7 \t\n\r\x00\x1b\x7f\"\\é€😀-q") + list(SECRETS)), max_size=12).map("".join)
_scalar = (_text | st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True, allow_infinity=True))
_key = _text | st.integers() | st.booleans() | st.none()
_data = st.recursive(_scalar, lambda c: st.lists(c, max_size=4) | st.lists(c, max_size=3).map(tuple)
                     | st.dictionaries(_key, c, max_size=4), max_leaves=25)


@settings(max_examples=400, deadline=None)
@given(_data)
def test_emit_json_is_json_dumps_of_the_safe_copy(data: object) -> None:
    mp = pytest.MonkeyPatch()
    try:
        assert _emitted(data, mp) == _reference(data)
    finally:
        mp.undo()


def test_secrets_and_control_characters_never_reach_the_json(monkeypatch: pytest.MonkeyPatch) -> None:
    data = {"hunter2-sudo": ["sudo: hunter2-sudo\x1b[2J", {"k": 'x pa"ss\\word\x01 y'}], "n": [1, 2.5, None, True]}
    text = _emitted(data, monkeypatch)
    assert text == _reference(data)
    back = json.loads(text)
    assert back == {MASK: [f"sudo: {MASK}[2J", {"k": f"x {MASK} y"}], "n": [1, 2.5, None, True]}
    assert "hunter2" not in text and "\\u001b" not in text and "rd y" not in text


def test_what_json_cannot_write_fails_as_before(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(TypeError):
        _emitted({"a": object()}, monkeypatch)
    loop: list[object] = []
    loop.append(loop)
    with pytest.raises(RecursionError):  # as _safe_json did
        _emitted(loop, monkeypatch)
    # a float key, and a value json writes specially, go the same way as json.dumps
    data = {1.5: math.inf, "x": -math.inf, "y": math.nan}
    assert _emitted(data, monkeypatch) == _reference(data)


_fields = st.lists(st.tuples(st.text(alphabet="abcé\x1b\n", max_size=6), _data), max_size=4, unique_by=lambda kv:
                   logs.mask(ui.clean(kv[0])))


@settings(max_examples=300, deadline=None)
@given(_fields, st.integers(min_value=-1, max_value=3), st.lists(_data, max_size=4))
def test_emit_json_stream_writes_what_emit_json_of_the_whole_writes(fields: list[tuple[str, object]], at: int,
                                                                    items: list[object]) -> None:
    """Issue 27: preflight's report at 512 hosts is written host by host (ui.emit_json_stream, a LazyList of hosts),
    never held whole; the text is the same, byte for byte, as the whole object's (every string cleaned and masked)."""
    streamed = list(fields)
    whole = dict(fields)
    if 0 <= at <= len(fields) and "hosts" not in whole:
        streamed.insert(at, ("hosts", ui.LazyList(iter(items))))
        whole = dict(streamed[:at] + [("hosts", items)] + streamed[at + 1:])  # type: ignore[list-item]
    mp = pytest.MonkeyPatch()
    try:
        out = io.StringIO()
        mp.setattr(sys, "stdout", out)
        ui.emit_json_stream(streamed)
        assert out.getvalue() == _reference(whole)
    finally:
        mp.undo()


def test_a_preflight_report_streams_its_hosts_as_its_json_says(monkeypatch: pytest.MonkeyPatch) -> None:
    from gpuk8s.inventory.model import Host, SSHSettings
    from gpuk8s.preflight.result import passed
    from gpuk8s.preflight.runner import HostReport, Report

    hosts = [HostReport(Host(f"gpu-{i}", f"10.0.0.{i}", "worker", SSHSettings()), True, None,
                        [passed("ssh.reachable", "ok hunter2-sudo")]) for i in range(3)]
    rep = Report(hosts, [passed("ssh.reachable", "cluster")], [], 1.234)
    out = io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    ui.emit_json_stream(rep.json_fields())
    assert out.getvalue() == _reference(rep.to_json()) and "hunter2" not in out.getvalue()
    assert [h["name"] for h in json.loads(out.getvalue())["hosts"]] == ["gpu-0", "gpu-1", "gpu-2"]
