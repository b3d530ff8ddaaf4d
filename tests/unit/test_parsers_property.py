"""Property: every parser of remote output returns a value or its own ParseError for any input."""

from __future__ import annotations

import contextlib

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuk8s.facts import parse as p
from gpuk8s.preflight.network import parse_iperf3, parse_ping
from gpuk8s.versions import release

texts = st.one_of(st.text(max_size=400), st.text(alphabet="@gpuk8s-begind 0123456789\n=,.[]\"'{}:", max_size=400))


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
    p.toml_tables(text)
    parse_ping(text)
    parse_iperf3(text)
    release(text)
    with contextlib.suppress(p.ParseError):
        p.parse_probe(text)
