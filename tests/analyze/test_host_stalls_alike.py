"""Ranks that stall alike get one idle_host_bound finding (host_stalls.group_alike), its what-if one replay
with every listed rank's stalls removed; a rank that stalls differently keeps its own finding.

On a real-derived run (copies of HTA's sampled 2-rank trace with distinct ranks and shifted clocks, as
benchmarks/scale_bench.py builds the 1,024-rank headline) the expected grouping is computed here from the
per-rank stall numbers of the `host_stalls` section by the documented rule (same severity, cause, label and
device; within ALIKE_SPREAD above the smallest; at least ALIKE_MIN_RANKS ranks), and the copies' numbers are
checked against each other (a copy holds the same events, shifted).
"""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import pytest

from tracekit.analyze.host_stalls import ALIKE_MIN_RANKS, ALIKE_SPREAD, _finding, group_alike
from tracekit.assess.critical_path import fix_for
from tracekit.findings.finding import FindingKind
from tracekit.whatif.fixes import RunFacts

SHARED = Path(os.environ.get("TRACEKIT_SHARED_TRACES") or Path(__file__).resolve().parents[3] / "shared" / "traces")
SEED = SHARED / "hta_sampled_2rank"
MS = 1_000_000


def _row(rank: int, stall_ms: float, label: str = "fetch", loading: bool = False, step_ms: float = 100.0) -> dict:
    stall = int(stall_ms * MS)
    step = int(step_ms * MS)
    return {"rank": rank, "steps": 2, "step_ns": step, "stall_ns": stall, "data_load_ns": stall if loading else 0,
            "gap_ns": 0 if loading else stall, "longest_gap_ns": stall // 2, "stall_fraction": stall / step,
            "recurring_fraction": stall / step, "step_fractions": [stall / step] * 2, "device": "gpu",
            "data_load_sources": [], "stall_labels": {label: stall}}


def _grouped(rows: list[dict]):
    findings = [f for f in (_finding(r, False) for r in rows) if f is not None]
    return group_alike(findings, {r["rank"]: r for r in rows})


def test_alike_ranks_become_one_finding_and_a_distinct_rank_keeps_its_own():
    """Ranks 0-5 stall 20.0-21.5 ms (within 10% of 20.0) in one label; rank 6 stalls 30 ms (a rank apart);
    rank 7 stalls 20 ms inside another label: three findings, the group listing 0-5 with each rank's numbers,
    its closed form the longest stall, its fix the stalls removed on the six ranks together."""
    rows = [_row(r, 20.0 + 0.3 * r) for r in range(6)] + [_row(6, 30.0), _row(7, 20.0, label="other")]
    out = _grouped(rows)
    assert len(out) == 3
    group = next(f for f in out if len(f.ranks) > 1)
    assert group.ranks == tuple(range(6))
    assert group.est_saving_ns == int(21.5 * MS) == group.evidence.stall_ns
    per_rank = group.evidence.details["per_rank"]
    assert [p["rank"] for p in per_rank] == list(range(6))
    assert [p["stall_ns"] for p in per_rank] == [int((20.0 + 0.3 * r) * MS) for r in range(6)]
    assert group.evidence.details["representative_rank"] == 5
    assert "6 ranks stall alike" in group.summary and "'fetch'" in group.summary
    assert sorted(f.ranks for f in out if len(f.ranks) == 1) == [(6,), (7,)]
    fixes = fix_for(group, RunFacts())
    assert len(fixes) == 1 and fixes[0].kind == "host_stalls" and fixes[0].ranks == tuple(range(6))
    assert fixes[0].touched_ranks() == list(range(6))


def test_too_few_or_spread_out_ranks_keep_one_finding_each():
    """Three alike ranks (below ALIKE_MIN_RANKS), or four whose stalls step up by more than ALIKE_SPREAD each,
    stay one finding per rank, unchanged."""
    few = [_row(r, 20.0) for r in range(ALIKE_MIN_RANKS - 1)] + [_row(ALIKE_MIN_RANKS - 1, 1.0)]  # one without
    assert [f.ranks for f in _grouped(few)] == [(r,) for r in range(ALIKE_MIN_RANKS - 1)]
    spread = [_row(r, 20.0 * (1 + 1.5 * ALIKE_SPREAD) ** r) for r in range(4)]
    out = _grouped(spread)
    assert [f.ranks for f in out] == [(r,) for r in range(4)]
    assert [f.summary for f in out] == [_finding(r, False).summary for r in spread]


def test_loading_and_host_gaps_do_not_group():
    """Same size, one cause each: data loading on four ranks, host gaps on four others: two groups."""
    rows = [_row(r, 20.0, loading=True) for r in range(4)] + [_row(r, 20.0) for r in range(4, 8)]
    out = _grouped(rows)
    assert sorted(f.ranks for f in out) == [(0, 1, 2, 3), (4, 5, 6, 7)]
    assert {f.evidence.cause for f in out} == {"data_load", "host_gap"}


def _real_derived(out: Path, copies: int) -> int:
    """`copies` copies of the seed's ranks: copy c of rank r is rank c * n + r, clocks shifted by c ms."""
    docs = []
    for f in sorted(SEED.iterdir()):
        if f.name.endswith((".json", ".json.gz")):
            with (gzip.open(f, "rb") if f.name.endswith(".gz") else open(f, "rb")) as fh:
                docs.append(json.load(fh))
    docs.sort(key=lambda d: d["distributedInfo"]["rank"])
    n = len(docs)
    out.mkdir()
    for rank in range(n * copies):
        c, doc = divmod(rank, n)[0], docs[rank % n]
        ev = [{**e, "ts": e["ts"] + c * 1_000} if isinstance(e.get("ts"), (int, float)) else e
              for e in doc["traceEvents"]]
        body = {**doc, "distributedInfo": {**doc["distributedInfo"], "rank": rank, "world_size": n * copies},
                "traceEvents": ev}
        with gzip.open(out / f"rank{rank:03d}.pt.trace.json.gz", "wt", compresslevel=1) as fh:
            json.dump(body, fh)
    return n


@pytest.fixture(scope="module")
def real_derived(tmp_path_factory):
    """An 8-rank real-derived run analyzed once: (analysis.json, seed ranks, the replayed steps, the run facts)."""
    if not SEED.is_dir():
        pytest.skip("shared trace corpus not available")
    from tracekit.analysis import analyze_run
    from tracekit.assess import critical_path

    tmp = tmp_path_factory.mktemp("alike")
    n = _real_derived(tmp / "run", copies=4)
    seen = {}
    rescore = critical_path.rescore

    def spy(findings, results, lay, regrade_severity=False):
        seen.update(results=results, lay=lay)
        return rescore(findings, results, lay, regrade_severity)

    critical_path.rescore = spy
    try:
        analyze_run(tmp / "run", tmp / "out", write_reports=False)
    finally:
        critical_path.rescore = rescore
    return json.loads((tmp / "out" / "analysis.json").read_text()), n, seen["results"], seen["lay"]


def test_real_derived_ranks_that_stall_alike_are_one_finding_with_one_replay(real_derived):
    doc, n, _, _ = real_derived
    rows = {r["rank"]: r for r in doc["sections"]["host_stalls"]["ranks"]}
    assert sorted(rows) == list(range(4 * n))
    for r in rows:  # every copy of a rank stalls as the rank does
        assert rows[r]["stall_ns"] == rows[r % n]["stall_ns"] and rows[r]["stall_labels"] == rows[r % n]["stall_labels"]
    # the documented rule on the section's numbers: ranks whose stall recurs (>= 5% of every step), alike by
    # label and cause, within ALIKE_SPREAD above the smallest
    held = sorted((r for r in rows.values() if r["recurring_fraction"] >= 0.05), key=lambda r: r["stall_ns"])
    lo = held[0]["stall_ns"]
    alike = sorted(r["rank"] for r in held if r["stall_ns"] <= lo + ALIKE_SPREAD * lo)
    assert len(alike) >= ALIKE_MIN_RANKS
    found = [f for f in doc["findings"] if f["kind"] == FindingKind.IDLE_HOST_BOUND.value]
    assert len(found) == 1 + len(held) - len(alike)
    group = next(f for f in found if len(f["ranks"]) > 1)
    assert group["ranks"] == alike
    ev = group["evidence"]
    assert [p["rank"] for p in ev["per_rank"]] == alike
    assert [p["stall_ns"] for p in ev["per_rank"]] == [rows[r]["stall_ns"] for r in alike]
    assert ev["closed_form_saving_ns"] == max(rows[r]["stall_ns"] for r in alike)
    # one what-if row for the group: one replay with every listed rank's stalls removed
    rows_w = [w for w in doc["sections"]["critical_path"]["whatif"] if w["kind"] == "idle_host_bound"]
    assert len(rows_w) == len(found)
    mine = next(w for w in rows_w if w["fix"] == ev["whatif"])
    assert mine["fix"].startswith(f"host stalls removed on {len(alike)} ranks")
    assert mine["saving_ns"] == ev["replayed_saving_ns"] == group["est_saving_ns"] > 0


def test_sparse_whatifs_equal_the_dense_replay_on_a_real_graph(real_derived):
    """A fix on named ranks (host stalls, slow host ops) is applied as overlays and re-timed where it reaches
    (whatif/fixes.apply_fixes_sparse, graph.replay_changed): each window's step time equals the whole graph's
    replay with the dense arrays, rank by rank and for several ranks together."""
    import numpy as np

    from tracekit.whatif import graph as graph_mod
    from tracekit.whatif.fixes import Fix, apply_fixes, apply_fixes_sparse
    from tracekit.whatif.replay import predict_all

    _, _, results, lay = real_derived
    g = results[0].graph
    ranks = [int(r) for r in np.unique(g.ranks)]
    cases = ([[Fix("host_stalls", rank=r)] for r in ranks] + [[Fix("host_repair", rank=r)] for r in ranks]
             + [[Fix("host_ahead", rank=r)] for r in ranks[:2]]
             + [[Fix("host_stalls", ranks=tuple(ranks[:3]))], [Fix("host_stalls", ranks=tuple(ranks))],
                [Fix("host_stalls", rank=ranks[0]), Fix("host_repair", rank=ranks[1])]])
    sparse = 0
    for fixes in cases:
        g.cache.predictions.clear()
        got = predict_all(g, fixes, lay)
        dur, gap = apply_fixes(g, fixes, lay)
        assert np.array_equal(got, graph_mod.rank_step_ns(g, graph_mod.replay(g, dur, gap), dur, gap)), fixes
        ov = apply_fixes_sparse(g, fixes, lay)
        assert ov is not None and np.array_equal(ov[0].dense(), dur) and np.array_equal(ov[1].dense(), gap)
        sparse += graph_mod.replay_changed(g, *ov) is not None
    assert sparse >= len(ranks)  # the one-rank fixes stayed local (re-timed without a whole replay)


def test_every_rank_of_the_run_stalling_alike_is_one_finding_however_few():
    """Two ranks, both stalling alike (20.0 and 21.5 ms): no peer without the stall, so one finding for both."""
    out = _grouped([_row(0, 20.0), _row(1, 21.5)])
    assert [f.ranks for f in out] == [(0, 1)] and "2 ranks stall alike" in out[0].summary
    assert [f.ranks for f in _grouped([_row(0, 20.0)])] == [(0,)]  # one rank is no group
