"""A hostile or broken host must not freeze or fool the client.

Every parser of a host's output takes time linear in it (up to the 8 MiB gpuk8s reads of a probe's answer,
runner.PROBE_MAX_OUTPUT, the cap imported here) and gives a value or ParseError, never another exception; a parser
or check that raises anyway fails that host.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path
from time import perf_counter

import pytest

from gpuk8s.facts import parse as p
from gpuk8s.facts.parse import CONTAINERD_CONFIG, SECTION_CAP, ParseError, Section, parse_containerd_config
from gpuk8s.inventory.model import Cluster, Host, Inventory, SSHSettings
from gpuk8s.preflight import runner
from gpuk8s.preflight.cluster_checks import check_cluster
from gpuk8s.preflight.host_checks import check_host
from gpuk8s.preflight.result import CHECKS, passed
from gpuk8s.versions import release

FIX = Path(__file__).resolve().parent.parent / "fixtures"
PROBE = (FIX / "h200" / "probe.txt").read_text()
M = runner.PROBE_MAX_OUTPUT  # the real cap: what gpuk8s reads of a host's probe answer
WORKER = Host("vm", "10.0.0.11", "worker", SSHSettings(), gpus=1)

# Lines on which the old table regex (^\s*\[\[?\s*(.+?)\s*\]\]?\s*(#.*)?$) backtracked cubically: at
# 1.5 KB they took it 1 to 5 s, at 3 KB 8 to 56 s, holding the GIL (Ctrl-C did nothing).
OLD_REGEX_BLOWUPS: dict[str, Callable[[int], str]] = {
    "bracket, spaces, bracket, spaces": lambda n: "[" + " " * (n // 2) + "]" + " " * (n // 2) + "x",
    "double bracket, spaces": lambda n: "[[" + " " * n,
    "bracket, spaces and tabs": lambda n: "[" + " \t" * (n // 2),
    "bracket, spaces, bracket": lambda n: "[" + " " * (n - 3) + "]x",
}


def _warm() -> None:
    p.parse_toml("a = 1\n")  # imports tomllib, outside the timed part


@pytest.mark.parametrize("size", [1536, 3072])
@pytest.mark.parametrize("shape", list(OLD_REGEX_BLOWUPS))
def test_old_table_regex_blowup_is_parsed_at_once(shape: str, size: int) -> None:
    _warm()
    text = "version = 2\n" + OLD_REGEX_BLOWUPS[shape](size) + "\n"
    t0 = perf_counter()
    cfg = parse_containerd_config(Section(text, 0))
    elapsed = perf_counter() - t0
    assert elapsed < 0.1, f"{elapsed:.3f} s for {size} bytes"
    assert cfg.present and "is not valid TOML" in cfg.error and cfg.error_file == CONTAINERD_CONFIG


def test_old_regex_blowup_in_a_dropin_names_that_file() -> None:
    _warm()
    drop = "@@file /etc/containerd/conf.d/10-ok.toml\nversion = 2\n@@file /etc/containerd/conf.d/99-nvidia.toml\n"
    t0 = perf_counter()
    cfg = parse_containerd_config(Section("version = 2\n", 0), Section(drop + "[[" + " " * 3072 + "\n", 0))
    assert perf_counter() - t0 < 0.1
    assert cfg.error_file == "/etc/containerd/conf.d/99-nvidia.toml" and cfg.error.startswith(cfg.error_file)


HOSTILE: dict[str, str] = {
    "brackets": "[" * M,
    "double brackets and spaces": "[[ " * (M // 3),
    "bracket spaces bracket": "[" + " " * (M // 2) + "]" + " " * (M // 2) + "x",
    "quotes": '"' * M,
    "triple quotes": '"""' * (M // 3),
    "apostrophes": "'" * M,
    "backslashes": "\\" * M,
    "one line": "x" * M,
    "NULs": "\0" * M,
    "newlines": "\n" * M,
    "unicode digits": "²٣" * (M // 2),
    "digits": "1" * M,
    "dotted versions": "1." * (M // 2),
    "dotted key": "a." * (M // 2) + "a = 1",
    "dotted keys, 64 deep, on every line": ("a." * 64 + "a = 1\n") * (M // 136),
    "dotted table header": "[" + "a." * (M // 2 - 1) + "a]",
    "dotted key in an inline table": "x = {" + "a." * (M // 2 - 4) + "a = 1}",
    "nested arrays": "a = " + "[" * (M - 4),
    "nested inline tables": "a = " + "{b = " * (M // 5),
    "unterminated multi-line string": 'a = """' + "\\" * (M - 8),
    "many tables": "".join(f"[t{i}]\nx = {i}\n" for i in range(M // 16)),
    "commas": "0, " * (M // 3),
    "csv with unicode digits": "², NVIDIA H200, GPU-x, ٥٣٥.١٠٤.٠٥, ٣٣, Disabled\n" * (M // 48),
    "section frames": "@@gpuk8s-begin x\n" * (M // 17),
    "drop-in frames": "@@file /etc/containerd/conf.d/x.toml\n" * (M // 37),
    "end frame with a huge status": "@@gpuk8s-begin x\n@@gpuk8s-end x " + "1" * (M - 40),
    "memtotal of the cap": "MemTotal: " + "1" * (M - 20) + " kB",
    "ss with unicode ports": "LISTEN 0 4096 0.0.0.0:²² 0.0.0.0:*\n" * (M // 36),
    "link/ether": "2: e: link/ether " + "0" * (M - 20),
}
HOSTILE = {name: text[:M] for name, text in HOSTILE.items()}


def _probe_with(body: str) -> str:
    """The real probe output with every section's text replaced by a share of `body` (the cap in all)."""
    names = list(p.split_sections(PROBE))
    share = body[: len(body) // len(names)]
    return "".join(f"@@gpuk8s-begin {n}\n{share}\n@@gpuk8s-end {n} 0\n" for n in names)


def _every_parser(text: str) -> None:
    for rc in (0, 141):
        sec = Section(text, rc)
        assert p.parse_nvidia_smi(sec, sec) is not None
        assert p.parse_containerd_config(sec, sec).present
        p.parse_daemon_json(sec)
        p.parse_lsmod(sec)
        p.parse_listening_ports(sec)
        p.parse_runtime_version("containerd", sec, sec)
        p.parse_runtime_version("docker", sec, sec)
    p.parse_os_release(text)
    p.parse_sysctl(text)
    p.parse_meminfo_mb(text)
    p.parse_macs(text)
    release(text)
    below_cap = text[: SECTION_CAP - 64]
    for toml in (text, below_cap):
        with suppress(ParseError):
            p.parse_toml(toml)
    # containerd's files just under the probe's cap: parsed for real, not refused for their size
    cfg = p.parse_containerd_config(Section(below_cap, 0), Section("@@file /etc/containerd/conf.d/a.toml\n"
                                                                   + below_cap, 0))
    assert cfg.present
    with suppress(ParseError):
        p.parse_probe(text)
    facts = p.parse_probe(_probe_with(text))
    check_host(WORKER, facts, Cluster())
    check_cluster({"vm": facts, "vm2": facts}, [], {"vm": 0.0}, 5.0)


@pytest.mark.parametrize("name", list(HOSTILE))
def test_every_parser_on_hostile_text_at_the_probe_cap(name: str) -> None:
    _warm()
    text = HOSTILE[name]
    assert len(text) <= M
    t0 = time.process_time()
    _every_parser(text)
    elapsed = time.process_time() - t0
    assert elapsed < 12.0, f"{elapsed:.2f} s of CPU"


@pytest.mark.parametrize("text", ["²", "٣", "¹²", "١٠", "৩", "𝟑", "1²"])
def test_unicode_digits_are_not_numbers(text: str) -> None:
    """str.isdigit() accepts them, int() raises on some and reads others: ASCII digits only."""
    g = p.parse_nvidia_smi(Section(f"{text}, NVIDIA H200, GPU-x, 580.159.04, 143771, Disabled", 0))
    assert g.state == "failed" and "unexpected" in g.error
    g = p.parse_nvidia_smi(Section(f"0, NVIDIA H200, GPU-x, 580.159.04, {text}, Disabled", 0))
    assert g.state == "ok" and g.gpus[0].memory_mib is None
    assert p.parse_meminfo_mb(f"MemTotal:       {text} kB\n") is None
    assert p.parse_listening_ports(Section(f"LISTEN 0 4096 0.0.0.0:{text} 0.0.0.0:*", 0)) == frozenset()
    probe = PROBE.replace("@@gpuk8s-begin nproc\n16\n", f"@@gpuk8s-begin nproc\n{text}\n")
    probe = probe.replace("@@gpuk8s-begin uid\n0\n", f"@@gpuk8s-begin uid\n{text}\n")
    assert "nproc\n" + text in probe
    f = p.parse_probe(probe)
    assert f.cpus is None and f.uid is None
    assert release(f"{text}.{text}.{text}") is None
    with pytest.raises(ParseError):  # not an exit status: the section never ends
        p.split_sections(f"@@gpuk8s-begin a\nx\n@@gpuk8s-end a {text}\n")


def test_numbers_too_long_for_int() -> None:
    """int() refuses more than 4300 digits with ValueError: such fields are unknown, not a crash."""
    digits = "9" * 5000
    assert p.parse_meminfo_mb(f"MemTotal: {digits} kB") is None
    g = p.parse_nvidia_smi(Section(f"{digits}, H200, GPU-x, 580.159.04, {digits}, Disabled", 0))
    assert g.state == "failed"
    with pytest.raises(ParseError):  # not an exit status: section a never ends, b is its text
        p.split_sections(f"@@gpuk8s-begin a\nx\n@@gpuk8s-end a {digits}\n@@gpuk8s-begin b\ny\n@@gpuk8s-end b 0\n")
    assert p.split_sections(f"@@gpuk8s-begin a\n@@gpuk8s-end a {digits}\n@@gpuk8s-end a 0\n") == {
        "a": Section(f"@@gpuk8s-end a {digits}", 0)}
    assert p.parse_toml(f"a = {'9' * 4000}").keys() == {"a"}
    with pytest.raises(ParseError):
        p.parse_toml(f"a = {digits}")


@pytest.mark.parametrize("text", ["nan", "inf", "-1", "1e9", "17e8.5", "١٧٠٠٠٠٠٠٠٠.5", "1700000000.%N"])
def test_clock_is_a_plain_number_or_unknown(text: str) -> None:
    """float() reads 'nan', which no skew check can compare: a host's clock must be digits."""
    head, _, _ = PROBE.partition("@@gpuk8s-begin time\n")
    assert p.parse_probe(head + f"@@gpuk8s-begin time\n{text}\n\n@@gpuk8s-end time 0\n").time is None


def test_clock_with_nanoseconds() -> None:
    head, _, _ = PROBE.partition("@@gpuk8s-begin time\n")
    f = p.parse_probe(head + "@@gpuk8s-begin time\n1700000000.123456789\n\n@@gpuk8s-end time 0\n")
    assert f.time == pytest.approx(1700000000.123456789)


@pytest.mark.parametrize("text", [
    'version = 2\n[plugins."io.containerd.grpc.v1.cri"\n',
    "version = 2\nversion = 3\n",
    "[a]\nx = 1\n[a]\ny = 2\n",
    'disabled_plugins = ["cri"\n',
    "a = " + "[" * 2000 + "]" * 2000 + "\n",
    "a = 99999" + "9" * 5000 + "\n",
    "\0",
    'a = "\\ud800"\n',
    "x" * 1000,
])
def test_invalid_containerd_toml_is_a_finding(text: str) -> None:
    cfg = parse_containerd_config(Section(text, 0))
    assert cfg.present and cfg.error.startswith(f"{CONTAINERD_CONFIG} is not valid TOML: ")
    assert cfg.error_file == CONTAINERD_CONFIG and len(cfg.error) < 400


def test_config_larger_than_the_probe_reads_is_a_finding() -> None:
    cut = parse_containerd_config(Section("# x\n" * 1000, 141))  # head -c cut it: SIGPIPE
    assert cut.present and cut.error == f"{CONTAINERD_CONFIG} {p.TOO_LARGE}" and cut.error_file == CONTAINERD_CONFIG
    forged = parse_containerd_config(Section("", 0), Section("#" * (SECTION_CAP + 1), 0))
    assert "256 KiB" in forged.error and forged.error_file == "/etc/containerd/conf.d/*.toml"


class _DummySession:
    closed = 0

    def __init__(self, host: Host, password: str | None = None) -> None:
        self.host = host

    def close(self) -> None:
        _DummySession.closed += 1


def _inventory() -> Inventory:
    return Inventory(Path("inventory.yaml"), Cluster(), SSHSettings(), (WORKER,))


def _run(monkeypatch: pytest.MonkeyPatch, probe: Callable[..., object],
         check: Callable[..., object] | None = None) -> runner.Report:
    monkeypatch.setattr(runner, "Session", _DummySession)
    monkeypatch.setattr(runner, "probe", probe)
    if check is not None:
        monkeypatch.setattr(runner, "check_host", check)
    return runner.run_preflight(_inventory(), concurrency=2, ignore=set(), sudo_passwords={},
                                measure_network=False)


class _Records(logging.Handler):
    """On the runner's own logger: gpuk8s's logging setup may stop propagation to pytest's handler."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_a_check_that_raises_fails_its_host(monkeypatch: pytest.MonkeyPatch) -> None:
    facts = p.parse_probe(PROBE)
    reached = [passed("ssh.reachable", "root@10.0.0.11:22"), passed("ssh.sudo", "root")]

    def boom(*_: object, **__: object) -> list[object]:
        raise IndexError("tuple index out of range")

    records = _Records()
    logging.getLogger("gpuk8s.preflight").addHandler(records)
    try:
        rep = _run(monkeypatch, lambda s, *prelude: (facts, reached, time.time(), PROBE), boom)
    finally:
        logging.getLogger("gpuk8s.preflight").removeHandler(records)
    (host,) = rep.hosts
    assert not rep.ok and host.failed and rep.to_json()["summary"]["hosts_failed"] == 1
    bug = [c for c in host.checks if c.id == "facts.parse"]
    assert len(bug) == 1 and bug[0].status == "fail" and bug[0].severity == "error" == CHECKS["facts.parse"]
    assert "checking its facts" in bug[0].message and "IndexError: tuple index out of range" in bug[0].message
    assert bug[0].remedy == "report this as a gpuk8s bug with the log file; re-run with --verbose"
    assert [c.id for c in host.checks] == ["ssh.reachable", "ssh.sudo", "facts.parse"]
    (logged,) = [r for r in records.records if "vm" in r.getMessage()]
    assert logged.exc_info and logged.exc_info[0] is IndexError  # the traceback goes to the log file


def test_a_parser_that_raises_fails_its_host(monkeypatch: pytest.MonkeyPatch) -> None:
    def probe(_: object, *prelude: object) -> object:
        raise KeyError("sysctl")

    _DummySession.closed = 0
    rep = _run(monkeypatch, probe)
    (host,) = rep.hosts
    assert not rep.ok and host.failed and _DummySession.closed == 1
    assert [(c.id, c.status) for c in host.checks] == [("facts.parse", "fail")]
    assert "gathering its facts: KeyError" in host.checks[0].message


def test_a_file_cannot_open_a_section() -> None:
    """A begin line inside a section is that section's text: a file cannot hijack the sections after it."""
    probe = PROBE.replace("LOGO=ubuntu-logo\n", "LOGO=ubuntu-logo\n@@gpuk8s-begin uid\n1000\n")
    f = p.parse_probe(probe)
    assert f.uid == 0 and f.os.id == "ubuntu" and f.kernel == "6.18.44-fc-v657-gpu"
