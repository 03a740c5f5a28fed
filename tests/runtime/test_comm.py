"""The comm layer: collectives and Megatron TP/SP/EP autograd helpers match single-process math; the log is complete."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from instrumented_runtime.comm import (Comm, all_to_all_autograd, copy_to_tp, gather_from_sp, gather_from_tp,
                                       reduce_from_tp, reduce_scatter_to_sp, scatter_to_sp, set_comm)
from tests.runtime._dist import run_distributed
from tracekit.record.commlog import CommLog, comms_log_path

pytestmark = pytest.mark.slow

SLOW_S = 0.02
SP_SHAPE = (2, 4, 3)  # (batch, seq, hidden); seq divisible by the tp group size


def _input(rank: int, shape: tuple[int, ...], salt: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * salt + rank)
    return torch.randn(shape, generator=g, dtype=torch.float64)


def _a2a_splits(ws: int) -> list[list[int]]:
    """S[r][s] = rows rank r sends to rank s: uneven, with zeros."""
    return [[(r + 2 * s) % 3 for s in range(ws)] for r in range(ws)]


def _tp_groups(ws: int) -> list[list[int]]:
    return [[0, 1]] if ws == 2 else [[0, 1], [2, 3]]


# Autograd helper cases: (name, input shared by the group?, downstream weight shared by the group?)
HELPERS = [("copy_to_tp", True, False), ("reduce_from_tp", False, True), ("gather_from_sp", False, False),
           ("reduce_scatter_to_sp", False, False), ("scatter_to_sp", True, False), ("gather_from_tp", False, True)]


def _helper_input(name: str, shared_in: bool, shared_w: bool, member: int, gi: int) -> tuple[torch.Tensor, int]:
    salt = 10 + [h[0] for h in HELPERS].index(name)
    x = _input(100 * gi + (0 if shared_in else member), SP_SHAPE, salt)
    return x, salt


def _apply_helper(name: str, x: torch.Tensor, group) -> torch.Tensor:
    fn = {"copy_to_tp": copy_to_tp, "reduce_from_tp": reduce_from_tp, "gather_from_sp": gather_from_sp,
          "reduce_scatter_to_sp": reduce_scatter_to_sp, "scatter_to_sp": scatter_to_sp,
          "gather_from_tp": gather_from_tp}[name]
    return fn(x, group)


def _exercise(rank: int, ws: int, out_dir: str) -> dict:
    log = CommLog(comms_log_path(out_dir, rank), rank, ws)
    comm = Comm(log, rank, slow_groups={"mesh_tp": SLOW_S})
    set_comm(comm)
    groups = [(members, dist.new_group(members, group_desc="mesh_tp")) for members in _tp_groups(ws)]
    gi, (members, tp) = next((i, g) for i, g in enumerate(groups) if rank in g[0])
    world = dist.group.WORLD
    res: dict = {"tp_members": members}
    comm.step = 7

    x = _input(rank, (3, 4), 1)
    t = x.clone()
    comm.all_reduce(t, world, label="test:ar")
    res["all_reduce"] = t
    out = torch.empty(ws * 3, 4, dtype=torch.float64)
    comm.all_gather_into_tensor(out, x, world)
    res["all_gather"] = out
    rs_in = _input(rank, (ws * 2, 4), 2)
    out = torch.empty(2, 4, dtype=torch.float64)
    comm.reduce_scatter_tensor(out, rs_in, world)
    res["reduce_scatter"] = out
    splits = _a2a_splits(ws)
    a2a_in = _input(rank, (sum(splits[rank]), 2), 3)
    out = torch.empty(sum(splits[s][rank] for s in range(ws)), 2, dtype=torch.float64)
    comm.all_to_all_single(out, a2a_in, [splits[s][rank] for s in range(ws)], splits[rank], world)
    res["all_to_all"] = out
    t = x.clone()
    comm.broadcast(t, ws - 1, world)
    res["broadcast"] = t
    t = x.clone()
    work = comm.all_reduce(t, world, op=dist.ReduceOp.MAX, async_op=True)
    work.wait()
    res["all_reduce_max"] = t
    comm.barrier(world)
    recv = torch.empty(3, 4, dtype=torch.float64)
    # profiler start-up is costly: the last rank (a non-zero rank in a subgroup) is enough
    with torch.profiler.profile(record_shapes=True) if rank == ws - 1 else contextlib.nullcontext() as prof:
        works = comm.batch_isend_irecv([("send", x, (rank + 1) % ws, world),
                                        ("recv", recv, (rank - 1) % ws, world)], label="test:ring")
        for w in works:
            w.wait()
        t = x.clone()
        comm.all_reduce(t, tp, label="test:slow")
    if prof is not None:
        prof.export_chrome_trace(str(Path(out_dir) / f"trace.rank{rank}.json"))
    res["p2p"] = recv
    res["tp_all_reduce"] = t

    # P2P inside the slow tp group: send to / receive from the other member; the send is never waited on
    other = members[1 - members.index(rank)]
    got = torch.empty(2, dtype=torch.float64)
    unwaited = comm.send(torch.full((2,), float(rank), dtype=torch.float64), other, tp, label="test:tp_send")
    comm.recv(got, other, tp, label="test:tp_recv").wait()
    res["tp_p2p"] = got
    dist.barrier()  # the peer has received, so the unwaited send is done on the wire
    comm.drain()
    unwaited.wait()  # already logged by drain: must not log twice

    comm.step = 8
    for name, shared_in, shared_w in HELPERS:
        xin, salt = _helper_input(name, shared_in, shared_w, members.index(rank), gi)
        xin.requires_grad_(True)
        y = _apply_helper(name, xin, tp)
        w = _input(100 * gi + (0 if shared_w else members.index(rank)), tuple(y.shape), salt + 50)
        (y * w).sum().backward()
        res[f"{name}:y"] = y.detach()
        res[f"{name}:grad"] = xin.grad

    a2a_x = _input(rank, (sum(splits[rank]), 2), 4).requires_grad_(True)
    y = all_to_all_autograd(a2a_x, [splits[s][rank] for s in range(ws)], splits[rank], world)
    (y * _input(rank, tuple(y.shape), 5)).sum().backward()
    res["a2a_autograd:y"] = y.detach()
    res["a2a_autograd:grad"] = a2a_x.grad
    log.close()
    set_comm(None)
    return res


@pytest.fixture(scope="module", params=[2, 4], ids=["world2", "world4"])
def exercised(request, tmp_path_factory) -> tuple[int, list[dict], Path]:
    ws = request.param
    out_dir = tmp_path_factory.mktemp(f"comm_world{ws}")
    return ws, run_distributed(ws, _exercise, str(out_dir)), out_dir


def _read_log(out_dir: Path, rank: int) -> tuple[dict, list[dict], dict]:
    lines = [json.loads(line) for line in comms_log_path(out_dir, rank).read_text().splitlines()]
    return lines[0], lines[1:-1], lines[-1]


def test_collectives_match_single_process_math(exercised):
    ws, res, _ = exercised
    xs = [_input(r, (3, 4), 1) for r in range(ws)]
    rs = [_input(r, (ws * 2, 4), 2) for r in range(ws)]
    splits = _a2a_splits(ws)
    a2a = [_input(r, (sum(splits[r]), 2), 3) for r in range(ws)]
    for r in range(ws):
        torch.testing.assert_close(res[r]["all_reduce"], sum(xs))
        torch.testing.assert_close(res[r]["all_gather"], torch.cat(xs))
        torch.testing.assert_close(res[r]["reduce_scatter"], sum(rs)[2 * r:2 * r + 2])
        torch.testing.assert_close(res[r]["broadcast"], xs[ws - 1])
        torch.testing.assert_close(res[r]["all_reduce_max"], torch.stack(xs).amax(0))
        torch.testing.assert_close(res[r]["p2p"], xs[(r - 1) % ws])
        members = res[r]["tp_members"]
        torch.testing.assert_close(res[r]["tp_all_reduce"], sum(xs[m] for m in members))
        other = members[1 - members.index(r)]
        torch.testing.assert_close(res[r]["tp_p2p"], torch.full((2,), float(other), dtype=torch.float64))
        # rank r receives, from each source s in order, the block s sends to r
        blocks = []
        for s in range(ws):
            start = sum(splits[s][:r])
            blocks.append(a2a[s][start:start + splits[s][r]])
        torch.testing.assert_close(res[r]["all_to_all"], torch.cat(blocks))


def _reference_helper(name: str, shared_in: bool, shared_w: bool, gi: int, n: int):
    """Single-process autograd of the same computation: returns per-member (y, grad of x)."""
    leaves = [_helper_input(name, shared_in, shared_w, m, gi)[0].requires_grad_(True)
              for m in range(1 if shared_in else n)]
    xs = [leaves[0 if shared_in else m] for m in range(n)]
    if name == "copy_to_tp":
        ys = [xs[m] for m in range(n)]
    elif name == "reduce_from_tp":
        ys = [sum(xs)] * n
    elif name == "gather_from_sp":
        ys = [torch.cat(xs, dim=1)] * n
    elif name == "reduce_scatter_to_sp":
        ys = list(sum(xs).chunk(n, dim=1))
    elif name == "scatter_to_sp":
        ys = list(xs[0].chunk(n, dim=1))
    else:  # gather_from_tp
        ys = [torch.cat(xs, dim=-1)] * n
    salt = _helper_input(name, shared_in, shared_w, 0, gi)[1]
    ws_ = [_input(100 * gi + (0 if shared_w else m), tuple(ys[m].shape), salt + 50) for m in range(n)]
    # A shared downstream weight means the region after the op is replicated: the loss counts once.
    loss = (ys[0] * ws_[0]).sum() if shared_w else sum((ys[m] * ws_[m]).sum() for m in range(n))
    loss.backward()
    return [(ys[m].detach(), leaves[0 if shared_in else m].grad) for m in range(n)]


@pytest.mark.parametrize("name,shared_in,shared_w", HELPERS, ids=[h[0] for h in HELPERS])
def test_tp_sp_autograd_helpers_match_single_process(exercised, name, shared_in, shared_w):
    ws, res, _ = exercised
    for gi, members in enumerate(_tp_groups(ws)):
        ref = _reference_helper(name, shared_in, shared_w, gi, len(members))
        for m, r in enumerate(members):
            torch.testing.assert_close(res[r][f"{name}:y"], ref[m][0], rtol=1e-12, atol=1e-12)
            torch.testing.assert_close(res[r][f"{name}:grad"], ref[m][1], rtol=1e-12, atol=1e-12)


def test_all_to_all_autograd_matches_single_process(exercised):
    ws, res, _ = exercised
    splits = _a2a_splits(ws)
    xs = [_input(r, (sum(splits[r]), 2), 4).requires_grad_(True) for r in range(ws)]
    ys = []
    for r in range(ws):
        ys.append(torch.cat([xs[s][sum(splits[s][:r]):sum(splits[s][:r + 1])] for s in range(ws)]))
    sum((ys[r] * _input(r, tuple(ys[r].shape), 5)).sum() for r in range(ws)).backward()
    for r in range(ws):
        torch.testing.assert_close(res[r]["a2a_autograd:y"], ys[r].detach())
        torch.testing.assert_close(res[r]["a2a_autograd:grad"], xs[r].grad)


def test_log_has_every_op_with_seq_sizes_and_peer(exercised):
    ws, res, out_dir = exercised
    splits = _a2a_splits(ws)
    for r in range(ws):
        header, entries, footer = _read_log(out_dir, r)
        assert header["type"] == "header" and header["rank"] == r and header["world_size"] == ws
        assert footer["type"] == "footer" and footer["entries"] == len(entries)
        world = [e for e in entries if e["process_group"][1] == "default_pg"]
        coll = sorted((e for e in world if not e["is_p2p"]), key=lambda e: e["collective_seq_id"])
        assert [e["collective_seq_id"] for e in coll] == list(range(1, len(coll) + 1))
        # 7 plain world collectives, then the differentiable all_to_all forward and backward
        assert [e["profiling_name"] for e in coll] == [
            "gloo:all_reduce", "gloo:all_gather", "gloo:reduce_scatter", "gloo:all_to_all", "gloo:broadcast",
            "gloo:all_reduce", "gloo:barrier", "gloo:all_to_all", "gloo:all_to_all"]
        ar, ag, rs, a2a, bc, ar_async, barrier, a2a_f, a2a_b = coll
        assert ar["input_sizes"] == [[3, 4]] and ar["input_dtypes"] == ["Double"] and ar["caller"] == "test:ar"
        assert ag["input_sizes"] == [[3, 4]] and ag["output_sizes"] == [[ws * 3, 4]]
        assert rs["input_sizes"] == [[ws * 2, 4]] and rs["output_sizes"] == [[2, 4]]
        col = [splits[s][r] for s in range(ws)]
        assert a2a["in_split_sizes"] == splits[r] and a2a["out_split_sizes"] == col
        assert a2a["input_sizes"] == [[sum(splits[r]), 2]] and a2a["output_sizes"] == [[sum(col), 2]]
        assert a2a_f["in_split_sizes"] == splits[r] and a2a_b["in_split_sizes"] == col  # backward swaps
        assert a2a_b["caller"] == "ep:all_to_all:bwd" and a2a_f["step"] == 8
        assert barrier["input_sizes"] == []
        for e in coll:
            assert e["group_ranks"] == list(range(ws)) and e["p2p_seq_id"] == 0
            assert e["state"] == "completed"
            assert e["time_created_ns"] <= e["time_discovered_started_ns"] <= e["time_discovered_completed_ns"]
        assert all(e["step"] == 7 for e in coll[:7])
        p2p = sorted((e for e in world if e["is_p2p"]), key=lambda e: e["p2p_seq_id"])
        assert [(e["profiling_name"], e["peer"], e["p2p_seq_id"], e["collective_seq_id"]) for e in p2p] == [
            ("gloo:send", (r + 1) % ws, 1, 0), ("gloo:recv", (r - 1) % ws, 2, 0)]
        assert p2p[0]["input_sizes"] == [[3, 4]] and p2p[1]["output_sizes"] == [[3, 4]]
        assert all(e["caller"] == "test:ring" and e["state"] == "completed" for e in p2p)


def test_slow_group_delay_lands_in_entry_duration(exercised):
    ws, res, out_dir = exercised
    expected_ops = {"gloo:all_reduce": 3, "gloo:all_gather": 4, "gloo:reduce_scatter": 2}
    for r in range(ws):
        _, entries, _ = _read_log(out_dir, r)
        members = res[r]["tp_members"]
        other = members[1 - members.index(r)]
        tp_p2p = sorted((e for e in entries if e["process_group"][1] == "mesh_tp" and e["is_p2p"]),
                        key=lambda e: e["p2p_seq_id"])
        assert [(e["profiling_name"], e["peer"], e["p2p_seq_id"], e["caller"], e["state"]) for e in tp_p2p] == [
            ("gloo:send", other, 1, "test:tp_send", "started"),  # never waited on: written by drain()
            ("gloo:recv", other, 2, "test:tp_recv", "completed")]
        assert tp_p2p[0]["time_discovered_completed_ns"] is None
        assert tp_p2p[1]["time_discovered_completed_ns"] - tp_p2p[1]["time_discovered_started_ns"] >= SLOW_S * 1e9
        tp = [e for e in entries if e["process_group"][1] == "mesh_tp" and not e["is_p2p"]]
        assert tp, "no mesh_tp entries"
        # all_reduce: test + copy_to_tp bwd + reduce_from_tp fwd; all_gather: gather_from_sp fwd,
        # reduce_scatter_to_sp bwd, scatter_to_sp bwd, gather_from_tp fwd; reduce_scatter: the two SP conjugates
        counts: dict[str, int] = {}
        for e in tp:
            counts[e["profiling_name"]] = counts.get(e["profiling_name"], 0) + 1
            assert e["group_ranks"] == members
            dur_ns = e["time_discovered_completed_ns"] - e["time_discovered_started_ns"]
            assert dur_ns >= SLOW_S * 1e9, e
        assert counts == expected_ops
        assert sorted(e["collective_seq_id"] for e in tp) == list(range(1, len(tp) + 1))
        assert {e["caller"] for e in tp} >= {"test:slow", "tp:copy_to_tp:bwd", "tp:sp_all_gather:bwd",
                                             "tp:sp_reduce_scatter:bwd"}


def test_profiler_regions_carry_group_and_seq(exercised):
    ws, res, out_dir = exercised
    for r in [ws - 1]:
        events = json.loads((out_dir / f"trace.rank{r}.json").read_text())["traceEvents"]
        _, entries, _ = _read_log(out_dir, r)
        slow = next(e for e in entries if e["caller"] == "test:slow")
        send = next(e for e in entries if e["caller"] == "test:ring" and e["profiling_name"] == "gloo:send")
        ar = [e for e in events if e.get("name") == "comm:all_reduce:mesh_tp"]
        p2p = [e for e in events if e.get("name") == "comm:p2p:default_pg"]
        assert len(ar) == 1 and len(p2p) == 1
        assert ar[0]["cat"] == "cpu_op"  # not a user_annotation: the caller label stays innermost
        args = ar[0]["args"]
        assert (args["Process Group Name"], args["Process Group Description"], args["seq_num"], args["is_p2p"],
                args["caller"]) == (slow["process_group"][0], "mesh_tp", slow["collective_seq_id"], 0, "test:slow")
        assert p2p[0]["args"]["seq_num"] == send["p2p_seq_id"] and p2p[0]["args"]["is_p2p"] == 1
        assert p2p[0]["args"]["seq_nums"] == f"{send['p2p_seq_id']},{send['p2p_seq_id'] + 1}"
        # the region encloses c10d's op and the injected delay
        c10d = [e for e in events if e.get("name") == "c10d::allreduce_"
                and ar[0]["ts"] <= e["ts"] <= ar[0]["ts"] + ar[0]["dur"]]
        assert len(c10d) == 1 and ar[0]["dur"] >= SLOW_S * 1e6


def _fail_on_rank1(rank: int, ws: int) -> int:
    if rank == 1:
        raise ValueError("boom on purpose")
    dist.barrier()  # would wait for rank 1 until the PG timeout: the helper must stop it instead
    return rank


def test_run_distributed_reraises_a_rank_failure_promptly():
    import time

    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match=r"(?s)rank 1 of 2 failed.*ValueError: boom on purpose"):
        run_distributed(2, _fail_on_rank1)
    assert time.monotonic() - t0 < 30
