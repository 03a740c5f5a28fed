"""`tracekit analyze --engine ray --address auto` on a three-node Ray cluster started with `ray start`
(a head and two worker nodes on this machine, 1 CPU each, their own ports, resources and object
stores; benchmarks/ray_cluster.py): the tables and the analysis equal the local engine's, and the
tasks ran on more than one node. The cluster is always stopped, also when the test fails; only the
processes it started are stopped."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from tests.conftest import quiet_section
from tests.scale.conftest import REPO, assert_stores_equal
from tracekit.tables.store import RunStore

pytestmark = [pytest.mark.ray, pytest.mark.slow]


@pytest.fixture(scope="module")
def cluster():
    pytest.importorskip("ray")
    from benchmarks.ray_cluster import RayCluster

    c = RayCluster(nodes=3, cpus_per_node=1)
    try:
        with quiet_section():  # `ray start` waits a fixed time for its raylet: not beside the other worker's jobs
            c.start()  # stops what it started itself if a node fails
        yield c
    finally:
        c.stop()
        assert not c.pids(), "processes of the test's Ray cluster outlived it"


def _tracekit(args: list[str], env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "tracekit", *args], env={**env, "PYTHONPATH": str(REPO)},
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _done(p: subprocess.Popen) -> str:
    """The command's stderr; it must have succeeded."""
    try:
        _, err = p.communicate(timeout=600)
    finally:
        p.kill()
    assert p.returncode == 0, err[-3000:]
    return err


def _independent(run: Path) -> dict[int, Counter]:
    """Per rank (distributedInfo.rank), the trace's GPU activities (kernels, memcpy, memset: the kernels
    table's rows) by name: plain gzip + json."""
    out = {}
    for f in sorted(run.glob("rank*.pt.trace.json.gz")):
        with gzip.open(f, "rb") as fh:
            doc = json.load(fh)
        out[doc["distributedInfo"]["rank"]] = Counter(
            e["name"] for e in doc["traceEvents"] if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"))
    return out


def test_three_node_cluster_gives_the_local_tables_and_analysis(cluster, tmp_path):
    from benchmarks.ray_cluster import node_of_tasks
    from benchmarks.scale_bench import ensure_real_run

    run, _ = ensure_real_run(tmp_path / "data", 16)  # 8 copies of a real 2-rank NCCL trace, clocks shifted
    env = cluster.env()
    assert env["RAY_ADDRESS"] == cluster.address
    ray_out, local_out = tmp_path / "ray", tmp_path / "local"
    ray = _tracekit(["analyze", str(run), "--out", str(ray_out), "--engine", "ray", "--address", "auto"], env)
    local = _tracekit(["analyze", str(run), "--out", str(local_out), "-j", "1", "-q"], dict(os.environ))
    stderr = _done(ray)
    _done(local)

    by_node = node_of_tasks(stderr)
    assert set(by_node) == {"node0", "node1", "node2"}, stderr[-2000:]  # the cluster's three nodes
    # a parse task per rank, and the activities in tasks of one or more ranks (rank_tasks.prefetch_rank_activity:
    # two tasks per worker at least, RANKS_PER_ACTIVITY_TASK ranks at most)
    assert 16 < sum(by_node.values()) <= 2 * 16, by_node
    assert sum(1 for n in by_node.values() if n > 0) >= 2, by_node  # the work was spread

    a, b = RunStore(local_out / "tables"), RunStore(ray_out / "tables")
    assert_stores_equal(a, b)
    assert b.ranks() == list(range(16))
    kernels = b.table("kernels").select(["rank", "name"]).to_pylist()
    got: dict[int, Counter] = {}
    for row in kernels:
        got.setdefault(row["rank"], Counter())[str(row["name"])] += 1
    assert got == _independent(run)

    x = json.loads((local_out / "analysis.json").read_text())
    y = json.loads((ray_out / "analysis.json").read_text())
    for doc in (x, y):  # the command line and the output paths name the engine and the folder
        doc.pop("command", None)
    assert x["findings"] == y["findings"]
    assert x == y
