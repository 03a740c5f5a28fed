"""The analyzer graph: dependencies come from signatures, results arrive as typed arguments, the plan
is printed by `tracekit analyze --explain-plan`, and bad declarations are refused."""

from __future__ import annotations

import graphlib
import inspect
from dataclasses import dataclass

import pytest
from typer.testing import CliRunner

from tracekit.analyze.runner import ANALYZERS, build_plan
from tracekit.assess import ASSESSMENT
from tracekit.cli.main import app
from tracekit.config import AnalysisConfig
from tracekit.findings.evidence import StragglerEvidence
from tracekit.findings.finding import Finding, FindingKind, Severity
from tracekit.findings.result import AnalyzerResult
from tracekit.flow import analyze_store, explain_plan
from tracekit.tables.store import RunStoreWriter


@dataclass(frozen=True)
class AResult(AnalyzerResult):
    value: int = 0


@dataclass(frozen=True)
class BResult(AnalyzerResult):
    total: int = 0


def make_a(store) -> AResult:
    return AResult(section={"value": 3}, value=3)


def make_b(a: AResult | None, config: AnalysisConfig) -> BResult:
    assert isinstance(a, AResult)
    return BResult(section={"total": a.value + config.max_timeline_intervals}, total=a.value + config.max_timeline_intervals)


def make_c(b: BResult | None, a: AResult | None) -> AnalyzerResult:
    f = Finding(kind=FindingKind.STRAGGLER, severity=Severity.INFO, summary=f"b={b.total if b else None}", evidence=StragglerEvidence(cause="compute", delay_ns_per_step=0))
    return AnalyzerResult(findings=[f], section={"b_seen": b is not None, "a_seen": a is not None})


def failing_a(store) -> AResult:
    raise RuntimeError("bad input")


def _store(tmp_path):
    return RunStoreWriter(tmp_path / "store").close()


def test_consumers_run_after_their_inputs_whatever_the_declared_order(tmp_path):
    plan = build_plan([("c", make_c), ("b", make_b), ("a", make_a)])
    assert [s.name for s in plan] == ["a", "b", "c"]
    assert plan[2].inputs == ("b", "a") and plan[1].inputs == ("a",)
    doc = analyze_store(_store(tmp_path), AnalysisConfig(max_timeline_intervals=10),
                        analyzers=[("c", make_c), ("b", make_b), ("a", make_a)])
    assert doc["sections"]["b"] == {"total": 13}
    assert doc["sections"]["c"] == {"b_seen": True, "a_seen": True}
    assert [f["summary"] for f in doc["findings"]] == ["b=13"]


def test_a_failed_input_arrives_as_none_and_is_listed(tmp_path):
    doc = analyze_store(_store(tmp_path), analyzers=[("a", failing_a), ("b", make_b), ("c", make_c)])
    # b asserts that its input arrived: it did not, so b fails too; c still runs and sees neither
    assert [e["analyzer"] for e in doc["analyzer_errors"]] == ["a", "b"]
    assert doc["analyzer_errors"][0]["error"] == "RuntimeError: bad input"
    assert doc["sections"] == {"c": {"b_seen": False, "a_seen": False}}


def test_cycles_wrong_types_and_unknown_parameters_are_refused():
    def x(y: AResult) -> AResult: ...
    def y(x: AResult) -> AResult: ...
    with pytest.raises(graphlib.CycleError):
        build_plan([("x", x), ("y", y)])
    with pytest.raises(TypeError, match="returns 'AResult'"):
        build_plan([("a", make_a), ("d", _wrong_annotation)])
    with pytest.raises(ValueError, match="'mystery'"):
        build_plan([("a", make_a), ("m", _unknown_parameter)])


def _wrong_annotation(a: BResult) -> AnalyzerResult: ...


def _unknown_parameter(a: AResult, mystery: int) -> AnalyzerResult: ...


def test_the_real_plan_orders_every_analyzer_after_what_its_signature_names():
    plan = build_plan()
    order = [s.name for s in plan]
    assert sorted(order) == sorted(n for n, _ in ANALYZERS)
    names = set(order)
    for s in plan:
        declared = [p for p in inspect.signature(s.fn).parameters if p in names and p != s.name]
        assert list(s.inputs) == declared
        assert all(order.index(d) < order.index(s.name) for d in declared)
    # the passes that take every finding (recommendations, critical_path) are the assessment's, not the plan's
    assert not {s.name for s in ASSESSMENT} & names
    assert all(s.result_type.endswith("Result") or s.result_type == "RankActivities" for s in plan)


def test_explain_plan_command_prints_the_graph():
    res = CliRunner().invoke(app, ["analyze", "--explain-plan"])
    assert res.exit_code == 0, res.output
    assert res.output.strip() == explain_plan().strip()
    lines = {ln.split(".", 1)[1].split()[0]: ln for ln in res.output.splitlines() if ln[:4].strip().rstrip(".").isdigit()}
    assert set(lines) == {n for n, _ in ANALYZERS} | {s.name for s in ASSESSMENT}
    numbers = [int(ln.split(".")[0]) for ln in res.output.splitlines() if ln[:4].strip().rstrip(".").isdigit()]
    assert numbers == list(range(1, len(ANALYZERS) + len(ASSESSMENT) + 1))
    assert "recommendations, findings of every analyzer" in lines["critical_path"]
    assert "<- matching, breakdown, activity" in lines["stragglers"]
    assert "=> StragglersResult" in lines["stragglers"]
