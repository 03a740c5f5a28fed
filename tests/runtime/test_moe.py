"""MoE: routing/capacity against a plain loop; ep=2 and ep=4 equal the single-process layer; routing statistics."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from instrumented_runtime.comm import Comm, set_comm
from instrumented_runtime.moe import MoE, MoEConfig, get_routing_recorder, routing_log_path
from tests.runtime._dist import run_distributed
from tracekit.record.commlog import CommLog, comms_log_path

D_MODEL, D_FF, NUM_EXPERTS, TOP_K, LAYER = 6, 8, 4, 2, 3
X_SHAPE = (2, 5, D_MODEL)  # 10 tokens per rank
# (capacity_factor, router_bias): drops; skew toward expert 3; everything on experts 0/1 (zero splits)
CASES = [(0.75, {}), (1.0, {3: 3.0}), (2.0, {0: 8.0, 1: 8.0})]


def _cfg(ci: int) -> MoEConfig:
    cf, bias = CASES[ci]
    return MoEConfig(num_experts=NUM_EXPERTS, top_k=TOP_K, capacity_factor=cf, aux_loss_weight=0.01,
                     router_bias=dict(bias))


def _tensor(shape: tuple[int, ...], salt: int) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(salt), dtype=torch.float64)


def _layer(ci: int, group=None) -> MoE:
    torch.manual_seed(1234)
    return MoE(D_MODEL, D_FF, _cfg(ci), LAYER, group).double()


def _loop_reference(moe: MoE, x: torch.Tensor) -> tuple[torch.Tensor, list[int], list[int], int]:
    """y, tokens per expert, kept per expert, capacity — by plain loops over tokens, for one rank's x."""
    cfg = moe.cfg
    xf = x.reshape(-1, D_MODEL)
    n = xf.shape[0]
    logits = xf @ moe.router.weight.t()
    for e, b in cfg.router_bias.items():
        logits[:, e] += b
    probs = torch.softmax(logits, -1)
    capacity = math.ceil(cfg.capacity_factor * n * cfg.top_k / cfg.num_experts)
    tokens, kept = [0] * cfg.num_experts, [0] * cfg.num_experts
    y = torch.zeros_like(xf)
    ranked = [sorted(range(cfg.num_experts), key=lambda e: -float(probs[t, e]))[:cfg.top_k] for t in range(n)]
    for slot in range(cfg.top_k):
        for t in range(n):
            e = ranked[t][slot]
            tokens[e] += 1
            if kept[e] < capacity:
                kept[e] += 1
                gate = probs[t, e] / sum(probs[t, j] for j in ranked[t])
                y[t] += gate * (F.gelu(xf[t] @ moe.w1[e]) @ moe.w2[e])
    return y.reshape(x.shape), tokens, kept, capacity


@pytest.mark.parametrize("ci", range(len(CASES)), ids=["drops", "skew", "two-experts"])
def test_single_process_layer_matches_loop_reference(ci):
    moe = _layer(ci)
    x = _tensor(X_SHAPE, 7)
    rec = get_routing_recorder()
    rec.clear()
    rec.step = 5
    with torch.no_grad():
        y, aux = moe(x)
        want_y, tokens, kept, capacity = _loop_reference(moe, x)
    torch.testing.assert_close(y, want_y, rtol=1e-12, atol=1e-12)
    n = X_SHAPE[0] * X_SHAPE[1]
    probs = torch.softmax(x.reshape(n, -1) @ moe.router.weight.detach().t() + torch.tensor(
        [moe.cfg.router_bias.get(e, 0.0) for e in range(NUM_EXPERTS)], dtype=torch.float64), -1)
    want_aux = 0.01 * NUM_EXPERTS * sum(tokens[e] / (n * TOP_K) * float(probs[:, e].mean())
                                        for e in range(NUM_EXPERTS))
    assert float(aux) == pytest.approx(want_aux, rel=1e-12)
    rows = rec.rows()
    rec.clear()
    assert [(r["step"], r["layer"], r["expert"]) for r in rows] == [(5, LAYER, e) for e in range(NUM_EXPERTS)]
    assert [r["tokens"] for r in rows] == tokens and sum(tokens) == n * TOP_K
    assert [r["dropped"] for r in rows] == [t - k for t, k in zip(tokens, kept)]
    assert all(r["capacity"] == capacity and r["forwards"] == 1 for r in rows)
    if ci == 0:
        assert sum(r["dropped"] for r in rows) > 0, "case meant to drop tokens dropped none"


def test_router_labels_and_recomputation_not_counted():
    moe = _layer(0)
    x = _tensor(X_SHAPE, 8).requires_grad_(True)
    rec = get_routing_recorder()
    rec.clear()
    rec.step = 1
    with torch.profiler.profile() as prof:
        y, aux = torch.utils.checkpoint.checkpoint(moe, x, use_reentrant=False)
        (y.sum() + aux).backward()
    names = {e.name for e in prof.events()}
    assert {"ep:router", "ep:dispatch", "ep:experts", "ep:combine"} <= names
    rows = rec.rows()
    rec.clear()
    # the recomputed forward in backward must not double the counts
    assert sum(r["tokens"] for r in rows) == X_SHAPE[0] * X_SHAPE[1] * TOP_K
    assert all(r["forwards"] == 1 for r in rows)


def test_recorder_sums_micro_batches_and_flushes(tmp_path):
    moe = _layer(1)
    rec = get_routing_recorder()
    rec.clear()
    rec.step, rec.profiled = 4, True
    xs = [_tensor(X_SHAPE, 40 + i) for i in range(3)]
    with torch.no_grad():
        for x in xs:  # three micro-batches in one step
            moe(x)
        refs = [_loop_reference(moe, x) for x in xs]
    path = tmp_path / "routing.jsonl"
    assert rec.flush(path) == NUM_EXPERTS and rec.rows() == []
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    for e, row in enumerate(rows):
        assert (row["step"], row["layer"], row["expert"], row["forwards"], row["profiled"]) == (4, LAYER, e, 3, True)
        assert row["tokens"] == sum(ref[1][e] for ref in refs)
        assert row["dropped"] == sum(ref[1][e] - ref[2][e] for ref in refs)
        assert row["capacity"] == sum(ref[3] for ref in refs)
    rec.step = 5
    with torch.no_grad():
        moe(xs[0])
    rec.flush(path)  # appends
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [4] * 4 + [5] * 4
    rec.clear()
    rec.profiled = False


def _ep_rank(rank: int, ws: int, out_dir: str) -> dict:
    import torch.distributed as dist

    comm = Comm(CommLog(comms_log_path(out_dir, rank), rank, ws), rank)
    set_comm(comm)
    group = dist.new_group(list(range(ws)), group_desc="mesh_ep")
    rec = get_routing_recorder()
    rec.clear()
    res: dict = {}
    for ci in range(len(CASES)):
        moe = _layer(ci, group)
        comm.step = rec.step = ci
        rec.profiled = ci == 1
        x = _tensor(X_SHAPE, 100 * ci + rank).requires_grad_(True)
        y, aux = moe(x)
        ((y * _tensor(X_SHAPE, 500 + 100 * ci + rank)).sum() + aux).backward()
        res[ci] = {"y": y.detach(), "aux": aux.detach(), "dx": x.grad, "dw1": moe.w1.grad, "dw2": moe.w2.grad,
                   "drouter": moe.router.weight.grad, "w1": moe.w1.detach()}
    rec.flush(routing_log_path(out_dir, rank))
    comm.log.close()
    set_comm(None)
    return res


@pytest.fixture(scope="module", params=[2, 4], ids=["ep2", "ep4"])
def ep_run(request, tmp_path_factory) -> tuple[int, list[dict], Path]:
    ws = request.param
    out_dir = tmp_path_factory.mktemp(f"moe_ep{ws}")
    return ws, run_distributed(ws, _ep_rank, str(out_dir)), out_dir


@pytest.mark.slow
@pytest.mark.parametrize("ci", range(len(CASES)), ids=["drops", "skew", "two-experts"])
def test_expert_parallel_matches_single_process(ep_run, ci):
    ws, res, _ = ep_run
    ref = _layer(ci)
    per = NUM_EXPERTS // ws
    xs = [_tensor(X_SHAPE, 100 * ci + r).requires_grad_(True) for r in range(ws)]
    outs = [ref(x) for x in xs]
    sum((y * _tensor(X_SHAPE, 500 + 100 * ci + r)).sum() + aux for r, (y, aux) in enumerate(outs)).backward()
    tol = dict(rtol=1e-10, atol=1e-12)
    for r in range(ws):
        got = res[r][ci]
        torch.testing.assert_close(got["w1"], ref.w1.detach()[r * per:(r + 1) * per], rtol=0, atol=0)
        torch.testing.assert_close(got["y"], outs[r][0].detach(), **tol)
        torch.testing.assert_close(got["aux"], outs[r][1].detach(), **tol)
        torch.testing.assert_close(got["dx"], xs[r].grad, **tol)
    # expert grads: each rank holds its slice; router grads: each rank holds its own tokens' share
    torch.testing.assert_close(torch.cat([res[r][ci]["dw1"] for r in range(ws)]), ref.w1.grad, **tol)
    torch.testing.assert_close(torch.cat([res[r][ci]["dw2"] for r in range(ws)]), ref.w2.grad, **tol)
    torch.testing.assert_close(sum(res[r][ci]["drouter"] for r in range(ws)), ref.router.weight.grad, **tol)


@pytest.mark.slow
def test_expert_parallel_routing_log_and_dispatch_splits(ep_run):
    ws, res, out_dir = ep_run
    n = X_SHAPE[0] * X_SHAPE[1]
    per = NUM_EXPERTS // ws
    for r in range(ws):
        rows = [json.loads(line) for line in routing_log_path(out_dir, r).read_text().splitlines()]
        assert {(row["step"], row["layer"]) for row in rows} == {(ci, LAYER) for ci in range(len(CASES))}
        for ci in range(len(CASES)):
            step_rows = sorted((row for row in rows if row["step"] == ci), key=lambda row: row["expert"])
            ref = _layer(ci)
            with torch.no_grad():
                _, tokens, kept, capacity = _loop_reference(ref, _tensor(X_SHAPE, 100 * ci + r))
            assert [row["tokens"] for row in step_rows] == tokens and sum(tokens) == n * TOP_K
            assert [row["dropped"] for row in step_rows] == [t - k for t, k in zip(tokens, kept)]
            assert all(row["capacity"] == capacity and row["profiled"] == (ci == 1) for row in step_rows)
            if ci == 1:  # bias toward expert 3 makes it the busiest
                assert tokens[3] == max(tokens) and tokens.count(tokens[3]) == 1
            # dispatch all_to_all sends each rank the kept tokens of its experts
            entries = [json.loads(line) for line in comms_log_path(out_dir, r).read_text().splitlines()[1:-1]]
            dispatch = [e for e in entries if e["step"] == ci and e["caller"] == "ep:dispatch"]
            assert len(dispatch) == 1
            assert dispatch[0]["in_split_sizes"] == [sum(kept[d * per:(d + 1) * per]) for d in range(ws)]
            assert dispatch[0]["input_sizes"] == [[sum(kept), D_MODEL]]
            callers = sorted(e["caller"] for e in entries if e["step"] == ci)
            assert callers == sorted(["ep:dispatch:counts", "ep:dispatch", "ep:combine", "ep:dispatch:bwd",
                                      "ep:combine:bwd"])
            if ci == 2:  # experts 2.. get nothing: some ranks receive zero rows
                assert 0 in dispatch[0]["in_split_sizes"]


@pytest.mark.parametrize("n,k,experts", [(10, 2, 4), (100, 2, 8), (7, 1, 4)])
def test_hash_router_gives_every_expert_the_same_load(n, k, experts):
    """Hash routing (the balanced re-run of benchmarks/whatif_rerun.py): token i's j-th choice is expert
    (i·k + j) mod E with gate 1/k; loads counted by a plain loop, the output against the loop's sum."""
    cfg = MoEConfig(num_experts=experts, top_k=k, capacity_factor=8.0, aux_loss_weight=0.01, router="hash")
    torch.manual_seed(0)
    moe = MoE(D_MODEL, D_FF, cfg, LAYER, None).double()
    x = _tensor((n, D_MODEL), 7)
    tokens = [0] * experts
    y = torch.zeros_like(x)
    for t in range(n):
        for j in range(k):
            e = (t * k + j) % experts
            tokens[e] += 1
            y[t] += (F.gelu(x[t] @ moe.w1[e]) @ moe.w2[e]) / k
    r = moe.route(x)
    assert r.tokens_per_expert.tolist() == tokens and max(tokens) - min(tokens) <= 1
    out, _ = moe(x)
    torch.testing.assert_close(out, y)
