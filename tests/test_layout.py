"""tracekit/layout.py (ParallelLayout) and tracekit/collectives.py: the mesh arithmetic checked against
tables built here by nested loops in the runtime's mesh order (pp outermost, then dp, cp, tp innermost)."""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from tracekit.collectives import bus_factor
from tracekit.layout import ParallelLayout, rank_to_host


def mesh_table(pp: int, dp: int, cp: int, tp: int) -> dict[int, dict[str, int]]:
    """rank -> coordinates, counting ranks up in the order DeviceMesh((pp, dp, cp, tp)) numbers them."""
    out, rank = {}, 0
    for p in range(pp):
        for d in range(dp):
            for c in range(cp):
                for t in range(tp):
                    out[rank] = {"pp": p, "dp": d, "cp": c, "tp": t}
                    rank += 1
    return out


@pytest.mark.parametrize("dp,tp,pp,cp,ep", [(2, 2, 2, 1, 1), (2, 1, 2, 2, 2), (4, 2, 1, 1, 2), (1, 3, 2, 2, 1)])
def test_coords_and_rank_of_round_trip_over_every_rank(dp, tp, pp, cp, ep):
    lay = ParallelLayout(dp=dp, tp=tp, pp=pp, cp=cp, ep=ep)
    table = mesh_table(pp, dp, cp, tp)
    assert lay.world_size == len(table) == dp * tp * pp * cp
    for rank, want in table.items():
        got = lay.coords(rank)
        assert {k: got[k] for k in ("pp", "dp", "cp", "tp")} == want
        assert lay.rank_of(want) == rank
        flat = want["dp"] * cp + want["cp"]   # the dp x cp rank that expert parallelism borrows
        assert (got["dp_cp"], got["ep"], got["edp"]) == (flat, flat % ep, flat // ep)


@pytest.mark.parametrize("dp,tp,pp,cp,ep", [(2, 2, 2, 1, 1), (4, 1, 2, 1, 2), (2, 2, 1, 2, 4)])
def test_group_ranks_are_the_ranks_differing_only_in_that_dim(dp, tp, pp, cp, ep):
    lay = ParallelLayout(dp=dp, tp=tp, pp=pp, cp=cp, ep=ep)
    table = mesh_table(pp, dp, cp, tp)

    def flat(c):
        return c["dp"] * cp + c["cp"]

    same = {  # dim -> the key a rank's group shares, from the independent table
        "pp": lambda c: (c["dp"], c["cp"], c["tp"]), "dp": lambda c: (c["pp"], c["cp"], c["tp"]),
        "cp": lambda c: (c["pp"], c["dp"], c["tp"]), "tp": lambda c: (c["pp"], c["dp"], c["cp"]),
        "dp_cp": lambda c: (c["pp"], c["tp"]),
        "ep": lambda c: (c["pp"], c["tp"], flat(c) // ep), "edp": lambda c: (c["pp"], c["tp"], flat(c) % ep),
    }
    sizes = {"pp": pp, "dp": dp, "cp": cp, "tp": tp, "dp_cp": dp * cp, "ep": ep, "edp": dp * cp // ep}
    for dim, key in same.items():
        groups = lay.groups(dim)
        assert sorted(r for g in groups for r in g) == list(table), dim   # a partition of the world
        for rank, c in table.items():
            want = [q for q, cq in table.items() if key(cq) == key(c)]
            assert sorted(lay.group_ranks(dim, rank)) == want, (dim, rank)
            assert len(want) == sizes[dim]
    assert lay.groups() == {d: lay.groups(d) for d in same}


def test_groups_come_in_device_mesh_order():
    lay = ParallelLayout(dp=2, tp=2, pp=2)
    assert lay.groups("tp") == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert lay.groups("dp") == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert lay.groups("pp") == [[0, 4], [1, 5], [2, 6], [3, 7]]
    ep = ParallelLayout(dp=4, ep=2)
    assert ep.groups("ep") == [[0, 1], [2, 3]] and ep.groups("edp") == [[0, 2], [1, 3]]


def test_split_layers_even_uneven_explicit_and_virtual():
    assert ParallelLayout(pp=4).split_layers(8) == [2, 2, 2, 2]
    assert ParallelLayout(pp=2).split_layers(5) == [3, 2]          # the first stages take the remainder
    assert ParallelLayout(pp=3).split_layers(7) == [3, 2, 2]
    assert ParallelLayout().split_layers(5) == [5]
    inter = ParallelLayout(pp=2, schedule="interleaved", virtual_stages=2, microbatches=4)
    assert inter.num_stages == 4 and inter.split_layers(6) == [2, 2, 1, 1]
    explicit = ParallelLayout(pp=2, stage_layers=(3, 1))
    assert explicit.split_layers(4) == [3, 1]
    assert [list(r) for r in explicit.stage_layer_ids(4)] == [[0, 1, 2], [3]]
    with pytest.raises(ValueError, match="sum to 4, not the model's 5"):
        explicit.split_layers(5)
    with pytest.raises(ValueError, match="3 layers cannot fill 4 pipeline stages"):
        ParallelLayout(pp=4).split_layers(3)


def test_virtual_stages_run_only_under_multi_chunk_schedules():
    assert ParallelLayout(pp=2, schedule="1f1b", virtual_stages=2).stages_per_rank == 1
    assert ParallelLayout(pp=2, schedule="zb", virtual_stages=2).stages_per_rank == 2
    assert ParallelLayout(pp=1, schedule="interleaved", virtual_stages=2).stages_per_rank == 1


@pytest.mark.parametrize("kw,message", [
    ({"tp": 0}, "tp must be an integer >= 1, got 0"),
    ({"dp": True}, "dp must be an integer >= 1"),
    ({"microbatches": 0}, "microbatches must be an integer >= 1"),
    ({"dp_mode": "zero3"}, "dp_mode must be one of ('ddp', 'fsdp'), got 'zero3'"),
    ({"schedule": "pipedream"}, "schedule 'pipedream' not one of"),
    ({"dp": 2, "cp": 2, "ep": 3}, "ep 3 must divide dp*cp = 4"),
    ({"pp": 2, "stage_layers": (4,)}, "stage_layers [4] must list 2 counts >= 1"),
    ({"pp": 2, "stage_layers": (4, 0)}, "stage_layers [4, 0] must list 2 counts >= 1"),
])
def test_validation_errors(kw, message):
    with pytest.raises(ValueError) as e:
        ParallelLayout(**kw)
    assert message in str(e.value)


def test_bad_ranks_and_coordinates_are_refused():
    lay = ParallelLayout(dp=2, tp=2)
    with pytest.raises(ValueError, match="rank 4 is not a rank of a 4-rank layout"):
        lay.coords(4)
    with pytest.raises(ValueError, match="coordinate tp=2 outside 0..1"):
        lay.rank_of({"dp": 0, "tp": 2})
    with pytest.raises(ValueError, match="unknown dimension 'xp'"):
        lay.groups("xp")
    with pytest.raises(dataclasses.FrozenInstanceError):
        lay.tp = 4  # type: ignore[misc]


def test_bus_factors_follow_nccl_tests():
    for n in (1, 2, 8):
        assert bus_factor("all_reduce", n) == 2 * (n - 1) / n
        for op in ("all_gather", "reduce_scatter", "all_to_all"):
            assert bus_factor(op, n) == (n - 1) / n
        assert bus_factor("broadcast", n) == bus_factor("send", n) == 1.0
    assert bus_factor("barrier", 4) is None and bus_factor("all_reduce", 0) is None


def test_rank_to_host_reads_each_manifest_form_then_the_ranks_table():
    rows = [{"rank": 0, "hostname": "a"}, {"rank": 1, "hostname": None}, {"rank": 2, "hostname": "b"}]
    assert rank_to_host(None, rows) == {0: "a", 2: "b"}
    assert rank_to_host({"0": "x", "1": "y"}, rows) == {0: "x", 1: "y"}           # manifest first
    assert rank_to_host({"x": [0, 2], "y": [1]}) == {0: "x", 2: "x", 1: "y"}       # host -> ranks
    assert rank_to_host(["x", "y"]) == {0: "x", 1: "y"}                           # indexed by rank
    assert rank_to_host({}, rows) == rank_to_host([], rows) == {0: "a", 2: "b"}


def test_every_small_layout_round_trips():
    for dp, tp, pp, cp in itertools.product((1, 2, 3), repeat=4):
        lay = ParallelLayout(dp=dp, tp=tp, pp=pp, cp=cp)
        assert [lay.rank_of(lay.coords(r)) for r in range(lay.world_size)] == list(range(lay.world_size))
