"""--engine ray: the same per-rank tasks on a local Ray instance give the local engine's tables and analysis."""

from __future__ import annotations

import os

import pytest

from tests.scale.conftest import assert_stores_equal
from tracekit.engines.local import LocalEngine
from tracekit.engines.rank_tasks import prefetch_rank_activity
from tracekit.flow import analyze_store
from tracekit.parse.run import parse_run

pytestmark = pytest.mark.ray


@pytest.fixture(scope="session")
def ray_engine():
    """One local Ray instance for the session (2 CPUs, no dashboard, no usage stats, short temp dir)."""
    ray = pytest.importorskip("ray")
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    from tracekit.engines.ray_engine import RayEngine

    engine = RayEngine(num_cpus=2)
    yield engine
    engine.close()
    assert not ray.is_initialized()


@pytest.mark.slow  # worker processes
def test_ray_path_gives_the_local_tables_and_analysis(ray_engine, synth_run_16, tmp_path):
    run, truth = synth_run_16
    local = parse_run(run, tmp_path / "local", progress=False).store
    remote = parse_run(run, tmp_path / "ray", progress=False, engine=ray_engine).store
    assert_stores_equal(local, remote)
    assert remote.ranks() == list(range(16))

    a = analyze_store(local, prefetch=prefetch_rank_activity(LocalEngine(workers=1)))
    b = analyze_store(remote, prefetch=prefetch_rank_activity(ray_engine))
    assert a == b
    stragglers = [f for f in b["findings"] if f["kind"] == "straggler"]
    assert stragglers and stragglers[0]["ranks"] == [truth["straggler_rank"]]
