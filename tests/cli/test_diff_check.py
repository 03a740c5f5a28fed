"""`tracekit diff` / `tracekit check`: the library (tracekit.compare.diff, tracekit.compare.check) against independent
arithmetic on small hand-made analyses, the CLIs' files and exit codes, and recorded runs of the reference
runtime with and without an injected slow rank."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from tracekit.compare.check import Thresholds, evaluate
from tracekit.cli.main import app
from tracekit.compare.diff import DiffConfig, diff_analyses, per_step_means

runner = CliRunner()
REPO = Path(__file__).resolve().parents[2]


def _rank(rank: int, steps: int, compute: int, exposed: int, other: int, idle: int, comm: int | None = None,
          bound: str = "compute") -> dict[str, Any]:
    return {"rank": rank, "steps": steps, "step_ns": (compute + exposed + other + idle) * steps,
            "compute_ns": compute * steps, "comm_ns": (comm if comm is not None else exposed) * steps,
            "exposed_comm_ns": exposed * steps, "other_ns": other * steps, "idle_ns": idle * steps,
            "overlap_ratio": None, "bound": bound}


def _finding(kind: str, sev: str, ranks: list[int], saving: int, dim: str | None = "dp", **evidence: Any) -> dict[str, Any]:
    return {"kind": kind, "severity": sev, "ranks": ranks, "dim": dim, "summary": f"{kind} on {ranks}",
            "evidence": evidence, "recommendation": "", "est_saving_ns": saving}


def _analysis(ranks: list[dict], findings: list[dict], sections: dict | None = None) -> dict[str, Any]:
    return {"schema": "tracekit.analysis/1", "tracekit_version": "0.1.0", "command": None,
            "inputs": {"ranks": [r["rank"] for r in ranks], "skipped": []}, "ranks": ranks,
            "findings": sorted(findings, key=lambda f: -f["est_saving_ns"]), "sections": sections or {}}


BASE = _analysis(
    [_rank(0, 2, 60_000_000, 10_000_000, 5_000_000, 5_000_000), _rank(1, 2, 62_000_000, 8_000_000, 5_000_000, 9_000_000)],
    [_finding("straggler", "warning", [1], 9_000_000),
     _finding("unoverlapped_collective", "info", [0], 10_000_000, op="all_reduce"),
     _finding("pipeline_bubble", "warning", [0, 1], 20_000_000, dim="pp"),
     _finding("expert_routing_skew", "info", [0, 1], 2_000_000, dim="ep", layer=1)],
    {"unoverlapped": {"by_rank_dim_op": [
        {"rank": 0, "dim": "dp", "op": "all_reduce", "instances": 4, "comm_ns": 30, "exposed_ns": 20, "steps": 2},
        {"rank": 1, "dim": "dp", "op": "all_reduce", "instances": 4, "comm_ns": 32, "exposed_ns": 16, "steps": 2}]},
     "pipeline": {"measured_bubble": 0.25, "schedule": "1f1b", "theoretical_bubble": 0.2},
     "stragglers": {"ranks": [{"rank": 0, "delay_fraction": 0.01}, {"rank": 1, "delay_fraction": 0.11}]},
     "experts": {"layers": [{"layer": 0, "skew": 1.3}, {"layer": 1, "skew": 2.6}]}})

NEW = _analysis(
    [_rank(0, 3, 60_000_000, 30_000_000, 5_000_000, 1_000_000), _rank(1, 3, 61_000_000, 29_000_000, 5_000_000, 2_000_000)],
    [_finding("straggler", "critical", [0], 40_000_000),  # another rank: a new finding, the old one resolved
     _finding("unoverlapped_collective", "warning", [0], 30_000_000, op="all_reduce"),  # severity changed
     _finding("pipeline_bubble", "warning", [0, 1], 20_500_000, dim="pp"),  # within noise: unchanged
     _finding("expert_routing_skew", "info", [1], 2_000_000, dim="ep", layer=1),  # ranks changed
     _finding("communication_bound", "warning", [0, 1], 25_000_000, dim=None)],
    {"unoverlapped": {"by_rank_dim_op": [
        {"rank": 0, "dim": "dp", "op": "all_reduce", "instances": 6, "comm_ns": 90, "exposed_ns": 80, "steps": 3},
        {"rank": 1, "dim": "dp", "op": "all_reduce", "instances": 6, "comm_ns": 93, "exposed_ns": 70, "steps": 3},
        {"rank": 0, "dim": "tp", "op": "all_gather", "instances": 6, "comm_ns": 10, "exposed_ns": 5, "steps": 3}]}})


def test_step_and_breakdown_means_match_arithmetic() -> None:
    d = diff_analyses(BASE, NEW)
    # mean rank, per step: sum of totals / sum of steps
    base_step = (80_000_000 * 2 + 84_000_000 * 2) / 4
    new_step = (96_000_000 * 3 + 97_000_000 * 3) / 6
    assert d["step"]["base_ns"] == base_step and d["step"]["new_ns"] == new_step
    assert d["step"]["delta_ns"] == new_step - base_step
    assert d["step"]["delta_ratio"] == pytest.approx((new_step - base_step) / base_step)
    assert d["max_step"]["base_ns"] == 84_000_000 and d["max_step"]["new_ns"] == 97_000_000
    parts = {p["part"]: p for p in d["breakdown"]}
    assert parts["exposed_comm"]["base_ns"] == (10_000_000 * 2 + 8_000_000 * 2) / 4
    assert parts["exposed_comm"]["new_ns"] == (30_000_000 * 3 + 29_000_000 * 3) / 6
    assert parts["idle"]["delta_ns"] == (1_000_000 * 3 + 2_000_000 * 3) / 6 - (5_000_000 * 2 + 9_000_000 * 2) / 4
    assert sum(parts[k]["new_ns"] for k in ("compute", "exposed_comm", "other", "idle")) == new_step
    assert [r["rank"] for r in d["ranks"]] == [0, 1]
    assert d["ranks"][1]["base_ns"] == 84_000_000 and d["ranks"][1]["new_ns"] == 97_000_000


def test_findings_appeared_resolved_changed_unchanged() -> None:
    d = diff_analyses(BASE, NEW, config=DiffConfig(min_saving_change_ratio=0.25, min_saving_change_ns=1_000_000))
    by = {(f["status"], f["kind"]) for f in d["findings"]}
    assert by == {("appeared", "straggler"), ("resolved", "straggler"), ("changed", "unoverlapped_collective"),
                  ("unchanged", "pipeline_bubble"), ("changed", "expert_routing_skew"),
                  ("appeared", "communication_bound")}
    stragglers = {f["status"]: f for f in d["findings"] if f["kind"] == "straggler"}
    assert stragglers["appeared"]["new_ranks"] == [0] and stragglers["appeared"]["base_ranks"] is None
    assert stragglers["resolved"]["base_ranks"] == [1] and stragglers["resolved"]["new_ranks"] is None
    assert d["finding_counts"] == {"appeared": 2, "changed": 2, "resolved": 1, "unchanged": 1}
    assert [f["status"] for f in d["findings"]][:2] == ["appeared", "appeared"]
    # a saving change above both floors makes an otherwise identical finding "changed"
    bigger = json.loads(json.dumps(NEW))
    next(f for f in bigger["findings"] if f["kind"] == "pipeline_bubble")["est_saving_ns"] = 30_000_000
    assert ("changed", "pipeline_bubble") in {(f["status"], f["kind"]) for f in diff_analyses(BASE, bigger)["findings"]}


def test_collective_deltas_sum_over_ranks() -> None:
    rows = {(r["group"], r["op"]): r for r in diff_analyses(BASE, NEW)["collectives"]}
    ar = rows[("dp", "all_reduce")]
    assert (ar["base_exposed_ns"], ar["new_exposed_ns"], ar["delta_exposed_ns"]) == (36, 150, 114)
    assert (ar["base_count"], ar["new_count"]) == (8, 12)
    ag = rows[("tp", "all_gather")]
    assert ag["base_exposed_ns"] is None and ag["new_exposed_ns"] == 5 and ag["delta_exposed_ns"] == 5


def test_check_thresholds_against_arithmetic() -> None:
    exposed = max(r["exposed_comm_ns"] / r["step_ns"] for r in BASE["ranks"])
    idle = max(r["idle_ns"] / r["step_ns"] for r in BASE["ranks"])
    step_ms = max(r["step_ns"] / r["steps"] for r in BASE["ranks"]) / 1e6
    res = {r.name: r for r in evaluate(BASE, Thresholds(
        max_exposed_comm=0.12, max_bubble=0.3, max_idle=0.1, max_step_ms=step_ms, max_skew=0.1,
        max_routing_skew=3.0, fail_on="warning"))}
    assert res["max_exposed_comm"].value == pytest.approx(exposed) and res["max_exposed_comm"].breached  # 0.125 > 0.12
    assert res["max_exposed_comm"].detail == "rank 0"
    assert res["max_bubble"].value == 0.25 and not res["max_bubble"].breached
    assert res["max_idle"].value == pytest.approx(idle) and res["max_idle"].breached and res["max_idle"].detail == "rank 1"
    assert res["max_step_ms"].value == pytest.approx(step_ms) and not res["max_step_ms"].breached  # equal is within
    assert res["max_skew"].value == 0.11 and res["max_skew"].breached and res["max_skew"].detail == "rank 1"
    assert res["max_routing_skew"].value == 2.6 and not res["max_routing_skew"].breached
    assert res["fail_on"].breached and res["fail_on"].value == 2  # two warnings in BASE
    assert not evaluate(BASE, Thresholds(fail_on="critical"))[0].breached


def test_check_unmeasured_threshold_never_fails() -> None:
    (r,) = evaluate(NEW, Thresholds(max_bubble=0.01))
    assert r.value is None and not r.breached and "pipeline" in r.detail
    with pytest.raises(ValueError):
        Thresholds(max_idle=-1)


@pytest.fixture(scope="module")
def analysis_files(tmp_path_factory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("an")
    (d / "base").mkdir()
    (d / "base" / "analysis.json").write_text(json.dumps(BASE))
    (d / "new.json").write_text(json.dumps(NEW))
    return d / "base", d / "new.json"


def test_check_cli_exit_codes(analysis_files: tuple[Path, Path], tmp_path: Path) -> None:
    base, _ = analysis_files
    res = runner.invoke(app, ["check", str(base), "--max-exposed-comm", "0.2", "--max-bubble", "0.3"])
    assert res.exit_code == 0, res.output
    assert "ok   --max-exposed-comm 0.2: 0.125 <= 0.2 (rank 0)" in res.stdout
    res = runner.invoke(app, ["check", str(base), "--max-exposed-comm", "0.1", "--max-bubble", "0.2",
                              "--json", str(tmp_path / "c.json")])
    assert res.exit_code == 1
    assert "FAIL --max-exposed-comm 0.1" in res.stdout and "FAIL --max-bubble 0.2: 0.25 > 0.2" in res.stdout
    assert [r["breached"] for r in json.loads((tmp_path / "c.json").read_text())] == [True, True]
    res = runner.invoke(app, ["check", str(base), "--fail-on", "critical"])
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, ["check", str(base), "--fail-on", "warning"])
    assert res.exit_code == 1 and "FAIL --fail-on warning: 2 finding(s)" in res.stdout
    # usage errors and nothing analysable: 2
    assert runner.invoke(app, ["check", str(base)]).exit_code == 2  # no limit given
    assert runner.invoke(app, ["check", str(base), "--max-idle", "abc"]).exit_code == 2
    assert runner.invoke(app, ["check", str(base), "--fail-on", "sometimes"]).exit_code == 2
    (tmp_path / "empty").mkdir()
    res = runner.invoke(app, ["check", str(tmp_path / "empty"), "--max-idle", "0.5"])
    assert res.exit_code == 2
    (tmp_path / "bad.json").write_text('{"schema": "something else"}')
    assert runner.invoke(app, ["check", str(tmp_path / "bad.json"), "--max-idle", "0.5"]).exit_code == 2


def test_diff_cli_writes_reports(analysis_files: tuple[Path, Path], tmp_path: Path) -> None:
    base, new = analysis_files
    res = runner.invoke(app, ["diff", str(base), str(new), "--out", str(tmp_path / "d")])
    assert res.exit_code == 0, res.output
    doc = json.loads((tmp_path / "d" / "diff.json").read_text())
    assert doc == json.loads(json.dumps(diff_analyses(BASE, NEW, base_label=str(base), new_label=str(new))))
    html = (tmp_path / "d" / "diff.html").read_text()
    assert "appeared" in html and "resolved" in html and html.count("<section") == 6
    # analysis.json files alone: no graph to replay, the explained change says so
    assert doc["attribution"] is None and "Why it changed" in html and "needs both runs&#x27; traces" in html
    md = (tmp_path / "d" / "diff.md").read_text()
    assert md in res.stdout
    assert "🆕 appeared: straggler on \\[0\\]" in md and "✅ resolved: straggler on \\[1\\]" in md
    assert "| **step** | 82.00 ms | 96.50 ms | +14.50 ms (+17.7%) |" in md
    res = runner.invoke(app, ["diff", str(base), str(tmp_path / "nope")])
    assert res.exit_code == 2


# ------------------------------------------------------------------ recorded runs of the reference runtime

FIXTURES = REPO / "tests" / "reports" / "fixtures"


def _slow_rank(truth: dict[str, Any]) -> int:
    """The rank the runtime slowed, from its ground truth (not from the command line it was given)."""
    (fault,) = [f for f in truth["faults"] if f["kind"] == "slow_rank"]
    assert "straggler" in fault["expected_findings"]
    (rank,) = fault["ranks"]
    return rank


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> dict[str, Any]:
    """The recorded clean and slow-rank runs, analysed through `tracekit analyze`."""
    d = tmp_path_factory.mktemp("recorded")
    runs: dict[str, Any] = {"dir": d}
    for name, src in (("clean", "runtime_dp2_clean"), ("slow", "runtime_dp2_slow_rank0")):
        res = runner.invoke(app, ["analyze", str(FIXTURES / src), "--out", str(d / name), "--quiet"])
        assert res.exit_code == 0, res.output
        runs[name] = d / name
    assert [f for f in json.loads((FIXTURES / "runtime_dp2_clean" / ".ground_truth.json").read_text())["faults"]] == []
    runs["slow_rank"] = _slow_rank(json.loads((FIXTURES / "runtime_dp2_slow_rank0" / ".ground_truth.json").read_text()))
    return runs


def _straggler_anchor(out: Path, rank: int) -> int | None:
    findings = json.loads((out / "analysis.json").read_text())["findings"]
    hits = [i for i, f in enumerate(findings, 1) if f["kind"] == "straggler" and f["ranks"] == [rank]]
    return hits[0] if hits else None


def test_summary_names_the_injected_straggler(recorded: dict[str, Any]) -> None:
    slow = recorded["slow_rank"]
    i = _straggler_anchor(recorded["slow"], slow)
    assert i is not None
    md_slow = (recorded["slow"] / "summary.md").read_text()
    row = next(line for line in md_slow.splitlines() if line.startswith(f"| [{i}](report.html#finding-{i}) |"))
    assert f"rank {slow} arrives last" in row and "| straggler" in row
    assert _straggler_anchor(recorded["clean"], slow) is None
    assert f"rank {slow} arrives last" not in (recorded["clean"] / "summary.md").read_text()
    html = (recorded["slow"] / "report.html").read_text()
    assert f'<tr id="finding-{i}">' in html


def test_diff_shows_the_fault_appear_and_resolve(recorded: dict[str, Any]) -> None:
    slow = recorded["slow_rank"]
    out = recorded["dir"]
    for base, new, status in (("clean", "slow", "appeared"), ("slow", "clean", "resolved")):
        res = runner.invoke(app, ["diff", str(recorded[base]), str(recorded[new]),
                                  "--out", str(out / f"diff-{base}-{new}"), "--quiet"])
        assert res.exit_code == 0, res.output
        doc = json.loads((out / f"diff-{base}-{new}" / "diff.json").read_text())
        hits = [f for f in doc["findings"] if f["kind"] == "straggler"
                and (f["new_ranks"] if status == "appeared" else f["base_ranks"]) == [slow]]
        assert [f["status"] for f in hits] == [status]
        md = (out / f"diff-{base}-{new}" / "diff.md").read_text()
        assert f"{status}: rank {slow} arrives last" in md
        # the slowed run's mean step is longer, whichever side it is on
        a_base = json.loads((recorded[base] / "analysis.json").read_text())
        a_new = json.loads((recorded[new] / "analysis.json").read_text())
        mean = lambda a: sum(r["step_ns"] for r in a["ranks"]) / sum(r["steps"] for r in a["ranks"])  # noqa: E731
        assert doc["step"]["delta_ns"] == pytest.approx(mean(a_new) - mean(a_base))
        assert (doc["step"]["delta_ns"] > 0) == (new == "slow")


def test_check_gates_the_slow_run(recorded: dict[str, Any]) -> None:
    """The straggler's delay share (stragglers section) breaches --max-skew in the slowed run only."""
    slow = json.loads((recorded["slow"] / "analysis.json").read_text())
    worst = max(r["delay_fraction"] for r in slow["sections"]["stragglers"]["ranks"])
    clean = json.loads((recorded["clean"] / "analysis.json").read_text())
    clean_worst = max(r["delay_fraction"] for r in clean["sections"]["stragglers"]["ranks"])
    limit = (worst + clean_worst) / 2
    res = runner.invoke(app, ["check", str(FIXTURES / "runtime_dp2_slow_rank0"), "--max-skew", f"{limit}"])
    assert res.exit_code == 1, res.output  # a trace dir straight in: parsed and analysed on the fly
    assert f"FAIL --max-skew {limit}: {worst:.4g} > {limit} (rank {recorded['slow_rank']})" in res.stdout
    assert runner.invoke(app, ["check", str(recorded["clean"]), "--max-skew", f"{limit}"]).exit_code == 0


@pytest.mark.slow
def test_fresh_slow_rank_run_against_recorded_clean(recorded: dict[str, Any], tmp_path: Path) -> None:
    """Records a new run with a slowed rank now and diffs it (trace dir straight in) against the recorded clean one."""
    traces = tmp_path / "slow"
    proc = subprocess.run([sys.executable, "-m", "instrumented_runtime", "--dp", "2", "--steps", "4", "--slow-rank", "1",
                           "--slow-factor", "3", "--out", str(traces)], cwd=REPO, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    slow = _slow_rank(json.loads((traces / ".ground_truth.json").read_text()))
    res = runner.invoke(app, ["diff", str(recorded["clean"]), str(traces), "--out", str(tmp_path / "d"), "--quiet"])
    assert res.exit_code == 0, res.output
    doc = json.loads((tmp_path / "d" / "diff.json").read_text())
    assert any(f["kind"] == "straggler" and f["new_ranks"] == [slow] and f["status"] in ("appeared", "changed")
               for f in doc["findings"]), [(f["status"], f["kind"], f["new_ranks"]) for f in doc["findings"]]
    assert (tmp_path / "d" / "new" / "tables" / "meta.json").is_file()  # the trace dir was parsed beside the diff
