"""The finding model (gpuk8s/findings.py): the model, the one registry of ids, and its rendering in the three
output modes (a rich table on a terminal, tab-separated lines when piped, JSON)."""

from __future__ import annotations

import ast
import dataclasses
import io
import json
import re
from pathlib import Path

import jsonschema
import pytest
from rich.console import Console

from gpuk8s import findings as fm
from gpuk8s import ui
from gpuk8s.findings import FINDINGS, Finding, Subject
from gpuk8s.inventory.model import Cluster
from gpuk8s.kube import state
from gpuk8s.options import Output
from gpuk8s.preflight import network, result
from gpuk8s.preflight.cluster_checks import check_cluster
from gpuk8s.preflight.host_checks import check_host
from gpuk8s.preflight.runner import HostReport, Report
from gpuk8s.report import findings as report
from tests.unit.test_checks import CP, HOST, facts

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "gpuk8s"
SCHEMA = json.loads((ROOT / "docs" / "preflight.schema.json").read_text())
SGR = re.compile(r"\x1b\[[0-9;]*m")


# --- the model --------------------------------------------------------------------------------------------


def test_constructors_take_the_severity_from_the_registry() -> None:
    assert fm.passed("gpu.count", "8 x H100") == Finding("gpu.count", "pass", "error", "8 x H100")
    assert fm.failed("gpu.count", "7 of 8", "reseat it").status == "fail"  # error severity: fail
    warn = fm.failed("k8s.swap", "swap on", "swapoff -a")
    assert (warn.status, warn.severity, warn.remedy) == ("warn", "warning", "swapoff -a")  # warning: warn
    skip = fm.skipped("net.rtt", "no ping", "install iputils-ping")
    assert (skip.status, skip.severity, skip.ok) == ("skip", "warning", True)
    with pytest.raises(KeyError, match="unregistered finding id 'gpu.nope'"):
        fm.failed("gpu.nope", "x", "y")


def test_a_finding_is_frozen_with_subject_and_evidence() -> None:
    f = fm.failed("node.not-ready", "NotReady: cni", "fix the CNI", subject=fm.node("gpu-1"),
                  evidence=["condition Ready: cni plugin not initialized", 3])  # type: ignore[list-item]
    assert f.subject == Subject("node", "gpu-1") and str(f.subject) == "node/gpu-1"
    assert f.evidence == ("condition Ready: cni plugin not initialized", "3") and not f.ok
    with pytest.raises(dataclasses.FrozenInstanceError):
        f.status = "pass"  # type: ignore[misc]
    assert hash(f) == hash(dataclasses.replace(f))
    assert f.about(fm.host("gpu-1")).subject == Subject("host", "gpu-1")
    assert f.to_json() == {"id": "node.not-ready", "status": "fail", "severity": "error", "message": "NotReady: cni",
                           "remedy": "fix the CNI", "ignored": False,
                           "evidence": ["condition Ready: cni plugin not initialized", "3"],
                           "subject": {"kind": "node", "name": "gpu-1"}}
    assert "subject" not in fm.passed("os.arch", "x86_64").to_json()  # where the enclosing object names it


def test_check_result_is_the_finding_and_checks_are_the_preflight_ids() -> None:
    assert result.CheckResult is Finding
    assert result.passed is fm.passed and result.failed is fm.failed and result.skipped is fm.skipped
    assert {i: s.severity for i, s in FINDINGS.items() if "preflight" in s.sources} == result.CHECKS
    assert "gpu.driver" in result.CHECKS and "node.not-ready" not in result.CHECKS  # --ignore takes preflight ids
    ignored = result.apply_ignores([fm.failed("gpu.count", "7 of 8", "x"), fm.failed("k8s.swap", "on", "y")],
                                   {"gpu.count"})
    assert [(f.status, f.ignored, f.message) for f in ignored] == [("warn", True, "7 of 8 (ignored)"),
                                                                   ("warn", False, "on")]
    assert fm.counts(ignored) == {"pass": 0, "warn": 2, "fail": 0, "skip": 0}


# --- the registry -----------------------------------------------------------------------------------------


def test_every_registered_id_is_well_formed_and_documented() -> None:
    doc = (ROOT / "docs" / "findings.md").read_text()
    rows = dict(re.findall(r"^\| `([a-z0-9.-]+)` \| (error|warning) \|", doc, re.M))
    for i, spec in FINDINGS.items():
        assert re.fullmatch(fm.ID_PATTERN, i), i
        assert re.fullmatch(SCHEMA["$defs"]["check"]["properties"]["id"]["pattern"], i), i
        assert spec.severity in ("error", "warning") and spec.what and spec.sources, i
        assert rows.get(i) == spec.severity, f"{i} ({spec.severity}) is not in docs/findings.md"
    assert set(rows) == set(FINDINGS), set(rows) ^ set(FINDINGS)


def _preflight_doc_ids() -> set[str]:
    """The ids of docs/preflight.md's table, where `runtime.installed / version / active` names three and
    `net.rtt / net.bandwidth` two."""
    doc = (ROOT / "docs" / "preflight.md").read_text()
    out = set()
    for cell in re.findall(r"^\| ([a-z0-9][a-z0-9./ -]*?) \| (?:error|warning) \|", doc, re.M):
        first, *rest = [c.strip() for c in cell.split(" / ")]
        out.add(first)
        out |= {r if "." in r else first.rsplit(".", 1)[0] + "." + r for r in rest}
    return out


def test_docs_preflight_lists_every_preflight_id() -> None:
    assert _preflight_doc_ids() == set(result.CHECKS)


def _string_constants() -> list[tuple[Path, int, str]]:
    out = []
    for path in sorted(SOURCE.rglob("*.py")):
        for n in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(n, ast.Constant) and isinstance(n.value, str):
                out.append((path, n.lineno, n.value))
    return out


def test_every_id_the_code_uses_is_registered() -> None:
    """A string constant shaped like an id of a registered family (gpu.*, node.*, k8s.*, ...) anywhere in
    gpuk8s/ is a registered id: a typo or a new id not added to the registry fails here."""
    families = {i.split(".")[0] for i in FINDINGS}
    shaped = re.compile(rf"(?:{'|'.join(sorted(families))})\.[a-z0-9]+(?:-[a-z0-9]+)*")
    used = {(p.relative_to(ROOT).as_posix(), line, v) for p, line, v in _string_constants() if shaped.fullmatch(v)}
    unknown = sorted(u for u in used if u[2] not in FINDINGS)
    assert not unknown, unknown
    assert len({v for _, _, v in used}) >= 50  # the test sees the ids (not a broken walk over nothing)


def test_every_id_passed_to_a_constructor_is_registered() -> None:
    """The first argument of passed/failed/skipped/Cause/PodVerdict and every cause_id, where constant."""
    makers = {"passed": 0, "failed": 0, "skipped": 0, "Cause": 0, "PodVerdict": 2}
    seen = []
    for path in sorted(SOURCE.rglob("*.py")):
        for n in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(n, ast.Call):
                name = n.func.attr if isinstance(n.func, ast.Attribute) else getattr(n.func, "id", "")
                pos = makers.get(name)
                args = ([n.args[pos]] if pos is not None and len(n.args) > pos else []) + \
                    [k.value for k in n.keywords if k.arg == "cause_id"]
                seen += [(path.name, n.lineno, a.value) for a in args if isinstance(a, ast.Constant)]
            if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant):
                seen += [(path.name, n.lineno, n.value.value) for t in n.targets
                         if isinstance(t, ast.Attribute) and t.attr == "cause_id"]
    unknown = [s for s in seen if s[2] not in FINDINGS]
    assert not unknown, unknown
    assert {"node.not-joined", "gpu.plugin-crashing", "gpu.test-pod-rejected", "gpu.test-pod-timeout",
            "cluster.reachable", "facts.parse"} <= {s[2] for s in seen}


def test_node_remedies_are_for_registered_ids() -> None:
    assert set(state.REMEDIES) <= set(FINDINGS)


# --- rendering --------------------------------------------------------------------------------------------

EVIDENCE = [f"line {i}" for i in range(10)]
SAMPLE = [
    fm.passed("gpu.count", "8 x NVIDIA H100 80GB"),
    fm.failed("gpu.driver", "nvidia-smi: [/bold] version mismatch", "reboot the host", evidence=EVIDENCE),
    fm.failed("k8s.swap", "swap is on", "swapoff -a"),
    fm.skipped("net.rtt", "no ping on the control plane", "install iputils-ping"),
]


def test_detail_shows_remedy_and_evidence_only_for_problems() -> None:
    assert report.detail(SAMPLE[0]) == "8 x NVIDIA H100 80GB"
    assert report.detail(SAMPLE[3]) == "no ping on the control plane"
    lines = report.detail(SAMPLE[1]).splitlines()
    assert lines[:3] == ["nvidia-smi: [/bold] version mismatch", "  -> reboot the host", "  | line 0"]
    assert lines[-2:] == ["  | line 7", "  | ... 2 more line(s) (-o json shows all)"]
    assert len(lines) == 2 + report.MAX_EVIDENCE + 1


def test_table_on_a_terminal(monkeypatch) -> None:
    con = Console(file=io.StringIO(), force_terminal=True, width=200, color_system="truecolor", highlight=False,
                  markup=False, emoji=False)
    monkeypatch.setattr(ui, "is_terminal", lambda: True)
    monkeypatch.setattr(ui, "console", lambda stderr=False: con)
    report.table("gpu-1 (10.0.0.11, worker): FAIL", SAMPLE)
    out = con.file.getvalue()  # type: ignore[attr-defined]
    assert "\x1b[" in out and "┃" in out  # styled, with box drawing: a real rich table
    plain = SGR.sub("", out)
    for shown in ("gpu-1 (10.0.0.11, worker): FAIL", "check", "status", "detail", "gpu.count", "ok",
                  "gpu.driver", "FAIL", "nvidia-smi: [/bold] version mismatch", "-> reboot the host", "| line 7",
                  "k8s.swap", "WARN", "net.rtt", "skip"):
        assert shown in plain, shown
    assert "| line 8" not in plain
    red_row = next(ln for ln in out.splitlines() if "gpu.driver" in ln)
    assert "\x1b[1;31m" in red_row  # a failure is bold red


def test_table_piped_is_one_tab_separated_line_per_finding(monkeypatch, capsys) -> None:
    monkeypatch.setattr(ui, "is_terminal", lambda: False)
    report.table("cluster", SAMPLE)
    lines = capsys.readouterr().out.splitlines()
    assert lines[:2] == ["# cluster", "check\tstatus\tdetail"]
    assert len(lines) == 2 + len(SAMPLE) and all(ln.count("\t") == 2 for ln in lines[1:])
    assert lines[2] == "gpu.count\tok\t8 x NVIDIA H100 80GB"
    assert lines[3].startswith("gpu.driver\tFAIL\tnvidia-smi: [/bold] version mismatch   -> reboot the host   | line 0")
    assert lines[4] == "k8s.swap\tWARN\tswap is on   -> swapoff -a"
    assert "\x1b" not in "".join(lines)


def test_json_mode(capsys) -> None:
    report.render("ignored in JSON", [f.about(fm.host("gpu-1")) for f in SAMPLE], Output.json)
    out = json.loads(capsys.readouterr().out)
    assert out["summary"] == {"pass": 1, "warn": 1, "fail": 1, "skip": 1}
    assert [f["id"] for f in out["findings"]] == ["gpu.count", "gpu.driver", "k8s.swap", "net.rtt"]
    drv = out["findings"][1]
    assert drv["evidence"] == EVIDENCE and drv["subject"] == {"kind": "host", "name": "gpu-1"}
    for f in out["findings"]:
        jsonschema.validate(f, {**SCHEMA["$defs"]["check"], "$defs": SCHEMA["$defs"]})


def test_subject_column(monkeypatch, capsys) -> None:
    monkeypatch.setattr(ui, "is_terminal", lambda: False)
    report.table("nodes", [fm.passed("node.verified", "Ready", subject=fm.node("gpu-1")), SAMPLE[2]], subject="node")
    lines = capsys.readouterr().out.splitlines()
    assert lines[1:] == ["node\tcheck\tstatus\tdetail", "gpu-1\tnode.verified\tok\tReady",
                         "\tk8s.swap\tWARN\tswap is on   -> swapoff -a"]


def test_the_verify_nodes_table_shows_each_node_finding(monkeypatch, capsys) -> None:
    from gpuk8s.flows import ClusterReport
    from gpuk8s.report.cluster import render_cluster

    monkeypatch.setattr(ui, "is_terminal", lambda: False)
    ok = state.NodeCheck("gpu-1", True, True, 8, 8, pod="gpuk8s-verify-gpu-1")
    bad = state.check_node("gpu-2", 4, None, [], None)
    render_cluster(ClusterReport(None, [], [ok, bad]), "verify")
    out = capsys.readouterr().out.splitlines()
    i = out.index("# nodes")
    assert out[i + 1:i + 4] == [
        "node\tcheck\tstatus\tdetail",
        "gpu-1\tnode.verified\tok\tReady, 8 of 8 GPU(s) schedulable, test pod gpuk8s-verify-gpu-1 succeeded",
        "gpu-2\tnode.not-joined\tFAIL\tnot a node of the cluster (not joined)   -> join it: gpuk8s join gpu-2   "
        "| kubectl get nodes lists no node gpu-2"]


# --- the preflight report: tables and JSON ---------------------------------------------------------------


def preflight_report() -> Report:
    good = HostReport(HOST, True, facts(), check_host(HOST, facts(), Cluster()))
    cp = HostReport(CP, False, None, [fm.failed("ssh.reachable", "refused: port 22", "start sshd")])
    links = [network.Link("gpu-1", 0.2, 9.4, "")]
    cluster = check_cluster({"gpu-1": facts()}, ["cp-1"], {"gpu-1": 1000.0}, 5.0)
    cluster += network.link_checks(links, 1.0, 10.0)
    cluster.append(fm.failed("net.bandwidth", "slow", "use 10 GbE", subject=fm.host("gpu-1"), evidence=["iperf3"]))
    return Report([good, cp], cluster, links, 1.5)


def test_the_preflight_json_still_validates_against_its_schema() -> None:
    rep = json.loads(json.dumps(preflight_report().to_json()))  # as -o json prints it
    jsonschema.validate(rep, SCHEMA)
    check = rep["hosts"][1]["checks"][0]
    assert list(check)[:6] == ["id", "status", "severity", "message", "remedy", "ignored"]  # the original keys
    assert check["evidence"] == [] and "subject" not in check
    assert rep["cluster"]["checks"][-1]["subject"] == {"kind": "host", "name": "gpu-1"}
    old = json.loads(json.dumps(rep))  # output of an older gpuk8s (no evidence, no subject) validates too
    for c in old["cluster"]["checks"]:
        c.pop("evidence"), c.pop("subject", None)
    jsonschema.validate(old, SCHEMA)
    bad = json.loads(json.dumps(rep))
    bad["cluster"]["checks"][0]["evidence"] = "not a list"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, SCHEMA)


def test_the_preflight_tables_are_finding_tables(monkeypatch, capsys) -> None:
    from gpuk8s.report import preflight

    monkeypatch.setattr(ui, "is_terminal", lambda: False)
    preflight.render(preflight_report(), 10.0, 1.0)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "# gpu-1 (10.0.0.11, worker): ready" and lines[1] == "check\tstatus\tdetail"
    assert "# cp-1 (10.0.0.10, control-plane): FAIL" in lines
    assert "ssh.reachable\tFAIL\trefused: port 22   -> start sshd" in lines
    assert "net.bandwidth\tWARN\tslow   -> use 10 GbE   | iperf3" in lines
    assert lines[-1].startswith("NOT READY: 2 host(s), 1 not ready")


# --- verify's test pods: the ids the phase sets ----------------------------------------------------------


@pytest.mark.parametrize(("status", "cause_id"), [
    (None, "gpu.test-pod-timeout"),
    ({"phase": "Failed", "reason": "OutOfnvidia.com/gpu", "message": "rejected"}, "gpu.test-pod-rejected"),
    ({"phase": "Failed"}, "gpu.test-pod-failed"),
    ({"phase": "Pending", "conditions": [{"reason": "Unschedulable", "message": "0/3 nodes"}]},
     "gpu.test-pod-unschedulable"),
    ({"phase": "Succeeded"}, ""),
])
def test_verify_sets_the_test_pod_cause_id(status: dict | None, cause_id: str, tmp_path) -> None:
    from gpuk8s.phases.base import Options
    from gpuk8s.phases.verify import Verify
    from tests.unit.fakekube import FakeKube
    from tests.unit.test_phases import ctx_for, running_cluster

    class Kube(FakeKube):
        """The test pods get `status` (None: no status ever, so the phase times out)."""

        def apply(self, text: str) -> str:
            out = super().apply(text)
            for (kind, _, name), o in self.objects.items():
                if kind == "pod" and name.startswith("gpuk8s-verify-") and status is not None:
                    o["status"] = status
            return out

    kube = Kube()
    running_cluster(kube)  # every node Ready with its GPUs allocatable: only the test pods decide
    ctx = ctx_for(kube, True, tmp_path)
    ctx.options = Options(test_pods=True, test_pod_timeout=0)
    Verify().run(ctx)
    gpu = [c for c in ctx.nodes if c.expected_gpus]
    assert gpu and all(c.cause_id == cause_id and c.ok == (cause_id == "") for c in gpu), ctx.nodes
    for c in gpu:
        f = c.finding()
        assert f.id == (cause_id or "node.verified") and f.subject == fm.node(c.node)
        assert f.status == ("pass" if c.ok else "fail")
