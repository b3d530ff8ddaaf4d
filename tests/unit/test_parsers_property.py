"""Property: every parser of remote output returns a value or its own ParseError for any input."""

from __future__ import annotations

import contextlib
import json
import re
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuk8s.facts import parse as p
from gpuk8s.facts.model import ContainerdConfig
from gpuk8s.preflight.network import parse_iperf3, parse_ping
from gpuk8s.versions import release

texts = st.one_of(st.text(max_size=400), st.text(alphabet="@gpuk8s-begind 0123456789\n=,.[]\"'{}:", max_size=400))
# TOML's punctuation, a few key characters and digits, unicode digits
toml_texts = st.one_of(
    st.text(alphabet="[]{}\"'=.,#\n \t\\_-ab1²٣@", max_size=400),
    st.lists(st.sampled_from(['[', '[[', ']', ']]', '"', "'", '"""', "'''", "\\", ".", "=", " ", "\n", "#", ",",
                              "{", "}", "a", "1", "true", '"io.containerd.grpc.v1.cri"', "plugins", "\\u00e9",
                              "\\U0010ffff", "\\ud800", "@@file /x\n"]), max_size=80).map("".join),
)


@settings(max_examples=300)
@given(texts, st.integers(min_value=-1, max_value=255))
def test_section_parsers(text: str, rc: int) -> None:
    sec = p.Section(text, rc)
    p.parse_nvidia_smi(sec, sec)
    p.parse_containerd_config(sec, sec)
    p.parse_daemon_json(sec)
    p.parse_lsmod(sec)
    p.parse_listening_ports(sec)
    p.parse_runtime_version("containerd", sec, sec)
    p.parse_runtime_version("docker", sec, sec)


@settings(max_examples=300)
@given(texts)
def test_text_parsers(text: str) -> None:
    p.parse_os_release(text)
    p.parse_sysctl(text)
    p.parse_meminfo_mb(text)
    p.parse_macs(text)
    with contextlib.suppress(p.ParseError):
        p.parse_toml(text)
    parse_ping(text)
    parse_iperf3(text)
    release(text)
    with contextlib.suppress(p.ParseError):
        p.parse_probe(text)


@settings(max_examples=500)
@given(toml_texts)
def test_toml_and_containerd_config(text: str) -> None:
    with contextlib.suppress(p.ParseError):
        assert isinstance(p.parse_toml(text), dict)
    with contextlib.suppress(ValueError):  # the Python 3.10 reader: a dict or its own ValueError
        assert isinstance(p._MiniToml(text).document(), dict)
    cfg = p.parse_containerd_config(p.Section(text, 0), p.Section(f"@@file /etc/containerd/conf.d/a.toml\n{text}", 0))
    assert isinstance(cfg, ContainerdConfig) and cfg.present
    assert bool(cfg.error) == bool(cfg.error_file)


_BARE = re.compile(r"[A-Za-z0-9_-]+")
chars = st.characters(blacklist_categories=["Cs"], blacklist_characters="\x7f")  # TOML refuses both raw
keys = st.one_of(st.from_regex(_BARE, fullmatch=True), st.text(chars, max_size=8))
scalars = st.one_of(st.booleans(), st.integers(min_value=-(10**18), max_value=10**18), st.text(chars, max_size=12))
values = st.one_of(scalars, st.lists(scalars, max_size=4))
documents = st.recursive(st.dictionaries(keys, values, max_size=4),
                         lambda inner: st.dictionaries(keys, st.one_of(values, inner), max_size=4), max_leaves=20)


def _key(k: str) -> str:
    return k if _BARE.fullmatch(k) else json.dumps(k, ensure_ascii=False)


def _value(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, list):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    return str(v) if isinstance(v, int) else json.dumps(v, ensure_ascii=False)


def _to_toml(data: dict[str, Any], name: str = "") -> str:
    out = "".join(f"{_key(k)} = {_value(v)}\n" for k, v in data.items() if not isinstance(v, dict))
    for k, v in data.items():
        if isinstance(v, dict):
            sub = f"{name}.{_key(k)}" if name else _key(k)
            out += f"[{sub}]\n" + _to_toml(v, sub)
    return out


@settings(max_examples=300)
@given(documents)
def test_toml_documents_read_back(data: dict[str, Any]) -> None:
    """Valid TOML reads back the same through tomllib and through the Python 3.10 reader."""
    text = _to_toml(data)
    assert p.parse_toml(text) == data
    assert p._MiniToml(text).document() == data
