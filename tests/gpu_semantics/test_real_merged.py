"""A merged multi-rank file (TraceLens TraceFusion: all ranks in one `traceEvents`, pid = rank·1e8 + raw pid,
`args.rank`) is split by rank: the real 4-rank MI300 DDP run in ../shared/traces.

Expected values come from the raw JSON (plain `json`, `Decimal` µs → integer ns): each rank's RCCL kernels
(`ncclDevKernel_*`, the rank from `args.rank`) in start order; instance i is the i-th kernel of every rank
(DDP issues its collectives in the same order on every rank); its arrival on a rank is that kernel's start
on the device; the last arrival is the rank with the latest start.
"""

from __future__ import annotations

import gzip
import json
from collections import Counter
from decimal import Decimal

import pytest

from tracekit.config import AnalysisConfig
from tracekit.flow import analyze_store
from tracekit.parse.run import parse_run

FOLDER = "amdhpc_cifar_resnet_ddp4_mi300_merged"


def _ns(v) -> int:
    return int(Decimal(str(v)) * 1000)


@pytest.fixture(scope="module")
def raw(shared_traces):
    doc = json.loads(gzip.decompress((shared_traces / FOLDER / "merged_all_events.json.gz").read_bytes()),
                     parse_float=Decimal)
    by_rank: dict[int, list[tuple[int, str]]] = {}
    for e in doc["traceEvents"]:
        if e.get("ph") == "X" and e.get("cat") == "kernel" and str(e["name"]).startswith("ncclDevKernel"):
            by_rank.setdefault(e["args"]["rank"], []).append((_ns(e["ts"]), e["args"].get("Collective name")))
    return {r: sorted(v) for r, v in by_rank.items()}


@pytest.fixture(scope="module")
def analysis(shared_traces, tmp_path_factory):
    res = parse_run(shared_traces / FOLDER, tmp_path_factory.mktemp("merged"), progress=False)
    return res, analyze_store(res.store, AnalysisConfig(isolate_analyzer_errors=False, advice=False))


def test_split_into_four_ranks(raw, analysis):
    res, a = analysis
    assert sorted(raw) == [0, 1, 2, 3]
    assert a["inputs"]["ranks"] == [0, 1, 2, 3]
    assert [r["rank"] for r in a["ranks"]] == [0, 1, 2, 3]
    # every rank's kernels are its own: the RCCL kernel count per rank is the raw one
    kernels = res.store.table("kernels", ["rank", "name"]).to_pylist()
    got = Counter(k["rank"] for k in kernels if k["name"].startswith("ncclDevKernel"))
    assert got == {r: len(v) for r, v in raw.items()}
    # the file holding only the same ranks' RCCL kernels is skipped, saying which file was kept
    skipped = {s["file"].rsplit("/", 1)[-1]: s["reason"] for s in res.skipped}
    assert set(skipped) == {f"merged_nccl_only.json.gz#rank{r}" for r in range(4)}
    assert all("kept" in why and "merged_all_events" in why for why in skipped.values())


def test_21_rccl_collectives_matched_and_the_last_arrival_named(raw, analysis):
    _, a = analysis
    n = {len(v) for v in raw.values()}
    assert n == {21}
    last = Counter(max(raw, key=lambda r: raw[r][i][0]) for i in range(21))
    ops = Counter(raw[0][i][1] for i in range(21))
    m = a["sections"]["matching"]
    assert (m["instances"], m["matched"], m["complete"]) == (21, 21, 21)
    per_rank = {x["rank"]: x["last_count"] for x in m["per_rank"]}
    assert per_rank == {r: last.get(r, 0) for r in range(4)}
    got_ops = Counter()
    for g in m["by_group"]:
        got_ops[g["op"]] += g["instances"]
    assert got_ops == {{"allreduce": "all_reduce"}.get(k, k): v for k, v in ops.items()}
    (late, count), = last.most_common(1)
    assert count == 21
    stragglers = [f for f in a["findings"] if f["kind"] == "straggler"]
    assert stragglers and stragglers[0]["ranks"] == [late]
    assert f"rank {late} arrives last at 21 of 21" in stragglers[0]["summary"]


def test_split_keeps_exact_times(tmp_path):
    """The split copies each event's JSON text: epoch-scale µs with ns fractions stay exact."""
    ev = []
    for r in (0, 1):
        pid = r * 100_000_000 + 7
        ev.append('{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": %d, "tid": 1, "ts": 1763000000000000.123, '
                  '"dur": 5.5, "args": {"rank": %d, "pid_raw": 7, "External id": 1}}' % (pid, r))
        ev.append('{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": %d, "tid": 1, '
                  '"ts": 1763000000000001.001, "dur": 1, "args": {"rank": %d, "pid_raw": 7, "correlation": 5}}' % (pid, r))
        ev.append('{"ph": "X", "cat": "kernel", "name": "gemm", "pid": %d, "tid": 7, "ts": 1763000000000010.%03d, '
                  '"dur": 3.25, "args": {"rank": %d, "pid_raw": 2, "correlation": 5, "stream": 7}}'
                  % (r * 100_000_000 + 2, 7 + r, r))
    path = tmp_path / "in" / "merged.json"
    path.parent.mkdir()
    path.write_text('{"traceEvents": [%s]}' % ", ".join(ev))
    res = parse_run(path.parent, tmp_path / "store", progress=False)
    k = res.store.table("kernels", ["rank", "ts", "dur", "step"]).to_pylist()
    assert sorted((x["rank"], x["ts"], x["dur"]) for x in k) == [
        (0, 1763000000000010007, 3250), (1, 1763000000000010008, 3250)]
