"""Experts analyzer on hand-built routing tables and all-to-all split sizes."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from tracekit.analyze.experts import analyze_experts, owners
from tracekit.findings.finding import FindingKind, Severity
from tracekit.tables.store import RunStoreWriter

MS = 1_000_000


def _base(path, world=4, manifest=None):
    w = RunStoreWriter(path, meta={"manifest": manifest or {}})
    w.append("ranks", pa.table({"rank": pa.array(range(world), pa.int32())}))
    w.append("process_groups", pa.table({"pg_name": ["ep0"], "pg_desc": ["mesh_ep"],
                                         "ranks": pa.array([list(range(world))], pa.list_(pa.int32())),
                                         "dim": ["ep"]}))
    return w


def test_routing_skew_names_layer_expert_and_owner(tmp_path):
    rng = np.random.default_rng(0)
    E, world = 8, 4
    w = _base(tmp_path / "s", world, manifest={"config": {"model": {"aux_loss_weight": 0.01,
                                                                    "capacity_factor": 1.25}}})
    truth = {}  # (step, layer) -> per-expert totals, computed independently below
    kept = np.zeros(world)  # tokens processed per owner rank (2 experts each), summed over steps
    for rank in range(world):
        rows = {k: [] for k in ("rank", "step", "layer", "expert", "tokens", "dropped", "capacity")}
        ev = {k: [] for k in ("rank", "step", "name", "ts", "dur")}
        for step in (3, 4):
            for layer in (1, 3):
                tok = rng.integers(40, 60, size=E)
                if layer == 3:
                    tok[5] = 300  # the hot expert
                drop = np.where(tok > 100, tok - 100, 0)
                truth.setdefault((step, layer), np.zeros(E, int))
                truth[(step, layer)] += tok
                kept += (tok - drop).reshape(world, 2).sum(axis=1)
                for e in range(E):
                    for k, v in (("rank", rank), ("step", step), ("layer", layer), ("expert", e),
                                 ("tokens", int(tok[e])), ("dropped", int(drop[e])), ("capacity", 100)):
                        rows[k].append(v)
            # expert compute: rank 2 owns experts 4,5 (hot) and is slower
            for k, v in (("rank", rank), ("step", step), ("name", "ep:experts"), ("ts", step * 100 * MS),
                         ("dur", (12 if rank == 2 else 4) * MS)):
                ev[k].append(v)
        w.append("routing", pa.table(rows))
        w.append("events", pa.table(ev))
    res = analyze_experts(w.close(), None)  # no layout: ep groups from the store
    sec = res.section
    assert sec["source"] == "routing"
    lay = {x["layer"]: x for x in sec["layers"]}
    exp_skew3 = np.mean([truth[(s, 3)].max() / truth[(s, 3)].mean() for s in (3, 4)])
    assert lay[3]["skew"] == pytest.approx(exp_skew3)
    assert lay[3]["hot_expert"] == 5 and lay[3]["hot_owner_ranks"] == [2]
    assert lay[1]["skew"] < 1.3
    h = [x for x in sec["heatmap"] if x["step"] == 4 and x["layer"] == 3][0]
    assert h["tokens"] == truth[(4, 3)].tolist()
    (f,) = res.findings
    assert f.kind is FindingKind.EXPERT_ROUTING_SKEW and f.severity is Severity.CRITICAL  # skew ≈ 5.6
    assert f.evidence.layer == 3 and f.evidence.expert == 5 and f.ranks == (2,) and f.dim == "ep"
    # saving: 3 × (hot − mean) forward expert time = 3 × (12 − 6) ms
    assert f.est_saving_ns == pytest.approx(3 * (12 - 6) * MS)
    assert "0.01" in f.recommendation and "layer 3" in f.recommendation
    # each rank receives what the ep group routed to its experts minus the dropped tokens
    rr = {x["rank"]: x for x in sec["ranks"]}
    for r in range(world):
        assert rr[r]["tokens_received"] == pytest.approx(kept[r] / 2)


def test_balanced_routing_no_finding(tmp_path):
    w = _base(tmp_path / "s", 2)
    for rank in range(2):
        w.append("routing", pa.table({"rank": pa.array([rank] * 4, pa.int32()), "step": pa.array([0] * 4, pa.int32()),
                                      "layer": pa.array([0] * 4, pa.int32()), "expert": pa.array(range(4), pa.int32()),
                                      "tokens": [50, 52, 48, 50], "dropped": [0, 0, 0, 0]}))
    res = analyze_experts(w.close(), None)  # no layout: ep groups from the store
    assert res.findings == []
    assert res.section["layers"][0]["skew"] == pytest.approx(104 / 100)


def test_fallback_to_dispatch_splits(tmp_path):
    w = _base(tmp_path / "s", 2)
    # two MoE calls per step; each rank sends [a, b] elements to ep ranks 0 and 1; combine calls ignored
    for rank in range(2):
        w.append("collectives", pa.table({
            "rank": pa.array([rank] * 3, pa.int32()), "op": ["all_to_all"] * 3, "step": pa.array([1] * 3, pa.int32()),
            "seq": [1, 2, 3], "caller": ["ep:dispatch", "ep:combine", "ep:dispatch"],
            "in_split_sizes": pa.array([[10, 10], [5, 5], [30, 10]], pa.list_(pa.int64())),
            "out_split_sizes": pa.array([[10, 10], [5, 5], [30, 10]], pa.list_(pa.int64())),
            "dur": [1 * MS, 2 * MS, 3 * MS]}))
    res = analyze_experts(w.close(), None)  # no layout: ep groups from the store
    sec = res.section
    assert sec["source"] == "all_to_all_splits" and sec["granularity"] == "ep_rank"
    lay = {x["layer"]: x for x in sec["layers"]}
    assert lay[0]["skew"] == pytest.approx(1.0)
    assert lay[1]["skew"] == pytest.approx(60 / 40) and lay[1]["hot_expert"] == 0
    (f,) = res.findings
    assert f.evidence.layer == 1 and f.ranks == (0,)
    rr = {x["rank"]: x for x in sec["ranks"]}
    assert rr[0]["a2a_ns"] == 6 * MS and rr[0]["a2a_calls"] == 3 and rr[0]["a2a_recv_elems"] == 70


def test_owners():
    assert owners(5, 8, [[0, 1, 2, 3], [4, 5, 6, 7]]) == [2, 6]
    assert owners(1, 3, [[0, 1]]) == []
