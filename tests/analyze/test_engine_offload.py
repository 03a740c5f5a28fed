"""Steps that need only the store, the layout, the stepless windows, the breakdown and the pipeline run on the engine's workers while the main process goes on
(`runner.measure`'s `submit`): the analysis is the one the main process alone gives, only steps whose result
is findings and a section travel, and a step whose remote run fails is run here instead."""

from __future__ import annotations

from concurrent.futures import Future
from pathlib import Path

from tracekit.analysis import analyze_run
from tracekit.analyze.runner import ANALYZERS, _plain_result, build_plan, measure
from tracekit.config import AnalysisConfig
from tracekit.engines.local import LocalEngine
from tracekit.engines.rank_tasks import step_submitter

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"


class CountingEngine(LocalEngine):
    """The local engine, recording which functions it was handed and whether a worker took them."""

    def __init__(self, workers: int) -> None:
        super().__init__(workers=workers)
        self.handed: list[tuple[str, bool]] = []

    def submit(self, fn, *args):
        fut = super().submit(fn, *args)
        self.handed.append((args[0].__name__, fut is not None))
        return fut


def _doc(run) -> dict:
    doc = dict(run.analysis)
    doc.pop("command", None)
    return doc


def test_workers_run_the_store_only_steps_and_the_analysis_is_the_serial_one(tmp_path):
    for name in ("ep", "pp_1f1b"):
        serial = analyze_run(FIXTURES / name, tmp_path / f"{name}_serial", workers=1)
        engine = CountingEngine(workers=2)
        try:
            parallel = analyze_run(FIXTURES / name, tmp_path / f"{name}_parallel", engine=engine)
        finally:
            engine.close()
        ran_there = {fn for fn, taken in engine.handed if taken}
        # the steps whose inputs are all shipped (layout, stepless, breakdown, pipeline) and whose result is
        # findings and a section: the pipeline and experts (layout), host_stalls and host_bound (stepless),
        # recording, trace_kind and ops (breakdown), throughput (layout, breakdown), memory (layout, pipeline)
        assert ran_there == {"analyze_pipeline", "analyze_experts", "analyze_recording", "analyze_trace_kind",
                             "analyze_ops", "analyze_throughput", "analyze_memory", "analyze_host_stalls",
                             "analyze_host_bound"}, engine.handed
        assert _doc(parallel) == _doc(serial)
        assert parallel.analysis["sections"]["pipeline"] == serial.analysis["sections"]["pipeline"]


def test_only_results_of_findings_and_a_section_travel():
    plain = {s.name for s in build_plan() if _plain_result(s.fn)}
    assert {"pipeline", "experts"} <= plain
    # results carrying tables or per-rank data stay where they are computed
    assert not plain & {"layout", "activity", "stepless", "matching", "unoverlapped"}


class _Broken:
    def submit(self, fn, *args):
        fut: Future = Future()
        fut.set_exception(RuntimeError("worker died"))
        return fut


def test_a_step_whose_remote_run_fails_is_run_here(tmp_path):
    store = analyze_run(FIXTURES / "ep", tmp_path / "ep", workers=1).store
    config = AnalysisConfig()
    alone, errors_alone = measure(store, config, ANALYZERS)
    broken = _Broken()
    broken.budget = None
    submit = step_submitter(broken)
    handed: list[str] = []

    def counting(fn, *args):
        handed.append(fn.__name__)
        return submit(fn, *args)

    got, errors = measure(store, config, ANALYZERS, submit=counting)
    assert "analyze_pipeline" in handed and "analyze_experts" in handed
    assert errors == errors_alone
    for name in ("pipeline", "experts"):
        assert got[name].section == alone[name].section
        assert [f.to_json() for f in got[name].findings] == [f.to_json() for f in alone[name].findings]


def test_the_workers_exit_before_the_assessment(tmp_path, monkeypatch):
    """Once the analyzers are done the engine's workers are idle: they exit (their memory goes back) before the
    critical path's replays run in this process; the analysis is the serial one."""
    import tracekit.flow as flow

    engine = CountingEngine(workers=2)
    at_assessment: list[bool] = []
    assess = flow.assess

    def watching(*args, **kwargs):
        at_assessment.append(engine._pool is None)
        return assess(*args, **kwargs)

    monkeypatch.setattr(flow, "assess", watching)
    try:
        parallel = analyze_run(FIXTURES / "ep", tmp_path / "parallel", engine=engine)
    finally:
        engine.close()
    assert any(taken for _, taken in engine.handed)  # a pool ran the per-rank work and the offloaded steps
    assert at_assessment == [True]
    serial = analyze_run(FIXTURES / "ep", tmp_path / "serial", workers=1)
    assert _doc(parallel) == _doc(serial)


def test_host_bound_on_a_worker_hands_its_slow_ops_to_the_critical_path(tmp_path, monkeypatch):
    """A real trace without ProfilerStep whose host has slow ops (hta_sampled_2rank: AccumulateGrad runs far
    longer than its median on both ranks): host_bound runs on a worker and sends its slow ops back, and the
    critical path builds its slow host time from them: this process derives no rank's host ops again. They are
    the slow ops derived afresh (`slow_ops_of` without them), and the analysis equals the serial one."""
    import os

    import numpy as np
    import pytest

    import tracekit.derive.host_ops as host_ops
    from tracekit.analyze.host_bound import analyze_host_bound

    shared = Path(os.environ.get("TRACEKIT_SHARED_TRACES")
                  or Path(__file__).resolve().parents[3] / "shared" / "traces") / "hta_sampled_2rank"
    if not shared.is_dir():
        pytest.skip("shared trace corpus not available")
    serial = analyze_run(shared, tmp_path / "serial", workers=1)
    found = analyze_host_bound(serial.store).slow_ops
    afresh = host_ops.slow_ops_of(serial.store, serial.store.ranks())
    assert found.keys() == afresh.keys() and sum(c["excess"].size for c in found.values()) > 0
    for r, cols in found.items():
        assert cols.keys() == afresh[r].keys()
        for c in cols:
            np.testing.assert_array_equal(cols[c], afresh[r][c])
    derived_here: list[int] = []
    summarize = host_ops.summarize_ops
    monkeypatch.setattr(host_ops, "summarize_ops", lambda ops: derived_here.append(1) or summarize(ops))
    engine = CountingEngine(workers=2)
    try:
        parallel = analyze_run(shared, tmp_path / "parallel", engine=engine)
    finally:
        engine.close()
    assert ("analyze_host_bound", True) in engine.handed and not derived_here
    assert _doc(parallel) == _doc(serial)
