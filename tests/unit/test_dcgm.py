"""DCGM's diagnostic (issue 32, the standard and long levels): `dcgmi diag -j` documents from real runs
(tests/fixtures/real/health/dcgm-*, each with its source: DCGM 4.5.2 on a GB10 with a failing software test and with
skipped tests, DCGM 3.x's -r 3 all passing), judged as health.dcgm-diag; hostile output bounded; the command run on a
host; the health phase's standard level."""

from __future__ import annotations

import json
import time

import pytest

from gpuk8s.facts.dcgm import MAX_BYTES, parse_diag
from gpuk8s.health import run
from gpuk8s.health.checks import judge_dcgm
from gpuk8s.phases import health as phase
from tests.unit.test_health import real
from tests.unit.test_quarantine import context

FAIL = "dcgm-diag-r2-4.5.2-gb10-software-fail-glimmer.json.txt"
SKIPPED = "dcgm-diag-r2-4.5.2-gb10-skipped-glimmer.json.txt"
V3 = "dcgm-diag-r3-3.x-pass-virtualclient.json.txt"
PERSISTENCE = ('Persistence Mode: Persistence mode for GPU 0 is disabled. Enable persistence mode by running '
               '"nvidia-smi -i <gpuId> -pm 1 " as root.')


def test_dcgm_4_reads_each_test_per_gpu_with_its_warning_and_the_versions() -> None:
    r = parse_diag(real(FAIL))
    assert r.read and (r.version, r.driver) == ("4.5.2", "580.82.09")
    assert [(x.category, x.test, x.gpu, x.status) for x in r.results] == [
        ("Deployment", "software", "0", "fail"), ("Hardware", "memory", "0", "pass"),
        ("Integration", "pcie", "0", "pass")]
    assert r.results[0].warnings == (PERSISTENCE,)
    f = judge_dcgm("standard", r)
    assert f.status == "fail" and f.message == ("dcgmi diag -r 2 (DCGM 4.5.2, driver 580.82.09): 1 result(s) failed: "
                                                f"software (GPU 0): {PERSISTENCE}")
    assert f.evidence == (f"Deployment/software GPU 0: fail: {PERSISTENCE}",)


def test_skipped_tests_are_said_never_passed() -> None:
    r = parse_diag(real(SKIPPED))
    assert [x.status for x in r.results] == ["fail", "skip", "skip"]
    v3 = parse_diag(real(V3))
    f = judge_dcgm("long", v3)
    assert f.status == "pass" and f.message == ("dcgmi diag -r 3 (DCGM ?): 16 result(s), none failed, not run: "
                                                "EUD Test")


def test_a_failure_said_only_in_the_test_summary_fails() -> None:
    doc = json.loads(real(FAIL))
    memory = doc["DCGM Diagnostic"]["test_categories"][1]["tests"][0]
    memory["test_summary"]["status"] = "Fail"  # every GPU's result Pass, the test's summary Fail
    r = parse_diag(json.dumps(doc))
    assert [(x.test, x.gpu, x.status) for x in r.results if x.test == "memory"] == [("memory", "0", "pass"),
                                                                                   ("memory", "", "fail")]
    assert judge_dcgm("standard", r).status == "fail"
    # the real document's own summaries (software Fail beside its failing GPU, memory Pass) add nothing
    assert len(parse_diag(real(FAIL)).results) == 3


def test_dcgm_3_reads_the_gpu_diagnostic_root_and_its_categories() -> None:
    r = parse_diag(real(V3))
    assert r.read and {x.category for x in r.results} == {"Deployment", "Integration", "Hardware", "Stress"}
    assert ("Hardware", "GPU Memory", "0", "pass") in [(x.category, x.test, x.gpu, x.status) for x in r.results]


def test_a_banner_before_the_document_an_unknown_status_and_a_runtime_error() -> None:
    doc = json.loads(real(FAIL))
    doc["DCGM Diagnostic"]["test_categories"][1]["tests"][0]["results"][0]["status"] = "Inconclusive"
    r = parse_diag("Successfully ran diagnostic for group.\n" + json.dumps(doc))
    assert r.read and [x.status for x in r.results][:2] == ["fail", "unknown"]  # never read as a pass
    assert "memory (GPU 0)" in judge_dcgm("standard", r).message
    err = parse_diag('{"DCGM Diagnostic": {"version": "4.5.2", "runtime_error": "Unable to start an embedded host '
                     'engine."}}')
    assert not err.read and err.error == "Unable to start an embedded host engine."
    f = judge_dcgm("standard", err)
    assert f.status == "fail" and "systemctl status nvidia-dcgm" in f.remedy


def test_not_installed_is_skipped_and_said() -> None:
    f = judge_dcgm("long", None)
    assert f.status == "skip" and f.message.startswith("DCGM is not installed: the long level's diagnostic "
                                                       "(dcgmi diag -r 3) was not run")


@pytest.mark.parametrize("text", [
    "", "Error: unable to establish a connection to the specified host: localhost\n",
    "[" * 200_000, '{"DCGM Diagnostic": {"test_categories": [' + '{"tests": [null, 1, "x"]},' * 50_000 + "{}]}}",
    "{" + '"a":' * 10 + "1" + "}" * 10, '{"other": {}}', "x" * (MAX_BYTES + 1),
    # a type where an array belongs, at each level (a parser that iterates it would raise)
    '{"DCGM Diagnostic": {"test_categories": 5}}', '{"DCGM Diagnostic": {"test_categories": [{"tests": 1}]}}',
    '{"DCGM Diagnostic": {"test_categories": [{"tests": [{"name": "t", "results": 2}]}]}}',
    '{"DCGM Diagnostic": {"test_categories": [{"tests": [{"name": "t", "results": {"status": "Pass"}}]}]}}',
    '{"DCGM Diagnostic": [], "metadata": 3}', '[1, 2]', '"Pass"',
])
def test_hostile_output_is_bounded_and_never_a_pass(text: str) -> None:
    t0 = time.process_time()
    r = parse_diag(text)
    assert time.process_time() - t0 < 2
    assert not r.read and r.error and judge_dcgm("standard", r).status == "fail"


def test_odd_warnings_and_entities_are_read_as_text_or_left_out() -> None:
    doc = {"DCGM Diagnostic": {"test_categories": [{"category": "c", "tests": [{"name": "t", "results": [
        {"entity_group": "GPU", "entity_id": True, "status": "Fail", "warnings": 7},
        {"entity_group": "Switch", "entity_id": 2, "status": "fail", "warnings": ["x" * 1000, {"warning": 5}, None]},
    ]}]}]}, "metadata": {"version": ["4"], "Driver Version Detected": "580.1\x1b[31m"}}
    r = parse_diag(json.dumps(doc))
    assert [(x.gpu, x.status, x.warnings) for x in r.results] == [("", "fail", ()), ("Switch 2", "fail",
                                                                                      ("x" * 300, "5"))]
    assert r.version == "" and "\x1b" not in r.driver


def test_many_results_are_kept_up_to_the_cap() -> None:
    results = [{"entity_group": "GPU", "entity_id": i % 8, "status": "Pass"} for i in range(10_000)]
    r = parse_diag(json.dumps({"DCGM Diagnostic": {"test_categories": [{"category": "c", "tests": [
        {"name": "t", "results": results}]}]}}))
    assert len(r.results) == 4096 and r.more == 10_000 - 4096
    assert "(and 5904 more)" in judge_dcgm("standard", r).message


class Res:
    def __init__(self, stdout: str, rc: int) -> None:
        self.stdout, self.stderr, self.exit_status = stdout, "", rc


class Sess:
    def __init__(self, res: Res) -> None:
        self.res, self.calls = res, []

    def run(self, command: str, **kw: object) -> Res:
        self.calls.append((command, kw))
        return self.res


def test_the_command_and_what_its_exit_means() -> None:
    s = Sess(Res(real(FAIL), 226))  # 226: the diagnostic ran and a test failed; its document is read
    f = run.dcgm(s, "standard")  # type: ignore[arg-type]
    (command, kw), = s.calls
    assert command.endswith("dcgmi diag -r 2 -j") and "command -v dcgmi" in command
    assert kw["sudo"] is True and kw["timeout"] == 1800
    assert f.status == "fail"
    s = Sess(Res("dcgmi: not installed\n", 127))
    assert run.dcgm(s, "long").status == "skip"  # type: ignore[arg-type]


def test_the_health_phase_runs_dcgm_at_the_standard_level(monkeypatch: pytest.MonkeyPatch) -> None:
    ctx = context("skip")
    ctx.inv = type(ctx.inv)(**{**ctx.inv.__dict__, "health": type(ctx.inv.health)("standard", "skip")})
    ran: list[str] = []

    def dcgm(session: object, level: str) -> object:
        ran.append(f"{session.host.name}:{level}")  # type: ignore[attr-defined]
        return judge_dcgm(level, parse_diag(real(FAIL)) if session.host.name == "good"  # type: ignore[attr-defined]
                          else parse_diag(real(V3)))

    monkeypatch.setattr(phase, "dcgm", dcgm)
    assert "dcgmi" not in str(ran) and "dcgmi diag -r 2 on each" in phase.Health().plan(ctx).reason and not ran
    r = phase.Health().run(ctx)
    # only where the quick level passed: a failing host's verdict is made without minutes of GPU tests
    assert ran == ["good:standard"]
    assert r.hosts["good"].startswith("not joined: health.dcgm-diag: dcgmi diag -r 2 (DCGM 4.5.2")
    assert r.hosts["bad"].startswith("not joined: health.xid")


def test_without_dcgm_the_standard_level_says_so_and_joins_on_the_quick_level(monkeypatch: pytest.MonkeyPatch) -> None:
    ctx = context()
    ctx.inv = type(ctx.inv)(**{**ctx.inv.__dict__, "health": type(ctx.inv.health)("long", "quarantine")})
    monkeypatch.setattr(phase, "dcgm", lambda session, level: judge_dcgm(level, None))
    r = phase.Health().run(ctx)
    assert r.hosts["good"] == "healthy (the quick level only: DCGM is not installed)" and "good" not in ctx.quarantine
    said = [f for f in ctx.findings if f.id == "health.dcgm-diag"]
    assert len(said) == 1 and said[0].status == "skip" and said[0].subject.name == "good"  # type: ignore[union-attr]


def test_a_dcgm_run_that_raises_is_named_not_healthy(monkeypatch: pytest.MonkeyPatch) -> None:
    ctx = context("skip")
    ctx.inv = type(ctx.inv)(**{**ctx.inv.__dict__, "health": type(ctx.inv.health)("standard", "skip")})

    def boom(session: object, level: str) -> object:
        raise KeyError("x")

    monkeypatch.setattr(phase, "dcgm", boom)
    r = phase.Health().run(ctx)
    assert r.hosts["good"].startswith("not joined: health.dcgm-diag: gpuk8s failed while running DCGM's diagnostic")
