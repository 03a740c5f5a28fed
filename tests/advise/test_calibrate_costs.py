"""Backend cost calibration (tracekit/advise/calibrate.py) against plain arithmetic: per-op latency and
bandwidth recovered from transfer times made by a known rule, P2P rows paired, and the router skew that
reproduces a routing skew drawn from a known σ."""

from __future__ import annotations

import numpy as np
import pytest

from tracekit.advise.calibrate import CollPoint, coll_points, expected_skew, fit_op_cost, router_skew


def _row(op, size, nbytes, t_ns, count, pg="1", dim="tp"):
    factor = {"all_gather": (size - 1) / size, "all_reduce": 2 * (size - 1) / size}.get(op, 1.0)
    return {"pg_name": pg, "dim": dim, "op": op, "group_size": size, "bucket_bytes": nbytes, "count": count,
            "bytes_p50": nbytes, "time_ns_p50": int(t_ns), "busbw_gbps_p50": nbytes * factor / t_ns}


def test_latency_and_bandwidth_recovered_from_sizes_that_differ():
    lat_ns, gbs = 700_000, 0.5  # 0.7 ms + bus bytes at 0.5 GB/s (= 0.5 bytes per ns)
    pts = [CollPoint("dp", "all_reduce", 2, b, lat_ns + b / gbs, c) for b, c in ((64e3, 5), (256e3, 3), (1e6, 2))]
    lat_us, bw = fit_op_cost(pts, 360.0)
    assert lat_us == pytest.approx(700.0, rel=1e-6) and bw == pytest.approx(0.5, rel=1e-6)


def test_one_size_gives_the_latency_against_the_tiers_bandwidth():
    pts = [CollPoint("tp", "all_gather", 2, 16384.0, t, 1) for t in (900e3, 1.1e6, 1.0e6, 5e6, 1.05e6)]
    lat_us, bw = fit_op_cost(pts, 360.0)
    assert bw == 360.0
    assert lat_us == pytest.approx((1.05e6 - 16384 / 360.0) / 1e3)  # the median, not pulled by the 5 ms outlier


def test_rows_become_points_with_p2p_pairs_at_the_lesser_side():
    rows = [_row("all_gather", 2, 32768, 1.2e6, 96), _row("send", 2, 16384, 2e6, 48, pg="2", dim="pp"),
            _row("recv", 2, 16384, 8e6, 48, pg="2", dim="pp"), _row("barrier", 8, 0, 1e6, 1)]
    pts = {p.op: p for p in coll_points(rows)}
    assert set(pts) == {"all_gather", "sendrecv"}
    assert pts["all_gather"].bus_bytes == pytest.approx(32768 / 2)
    assert pts["sendrecv"].time_ns == 2e6 and pts["sendrecv"].bus_bytes == 16384 and pts["sendrecv"].dim == "pp"


def test_router_skew_recovers_the_sigma_that_drew_the_routing():
    rng = np.random.default_rng(7)
    experts, routed, sigma = 4, 2048, 0.4
    heat = []
    for step in range(400):
        z = rng.normal(0.0, sigma, experts)
        p = np.exp(z) / np.exp(z).sum()
        tokens = rng.multinomial(routed, p)
        heat.append({"step": step, "layer": 0, "tokens": tokens.tolist(), "skew": tokens.max() / tokens.mean()})
    analysis = {"sections": {"experts": {"layers": [{"layer": 0, "num_experts": experts,
                                                      "skew": float(np.mean([h["skew"] for h in heat]))}],
                                         "heatmap": heat}}}
    assert router_skew(analysis, experts) == pytest.approx(sigma, abs=0.05)
    assert expected_skew(0.0, experts, routed) < expected_skew(sigma, experts, routed)
    assert router_skew({"sections": {}}, experts) is None


def test_per_hop_latency_recovered_from_groups_of_several_sizes():
    # a ring backend (gloo): each hop pays 90 µs, bus bytes at 0.5 GB/s; all-gathers on 2, 4 and 8 members
    hop_ns, gbs = 90_000, 0.5
    pts = [CollPoint("dp", "all_gather", n, b, (n - 1) * hop_ns + b / gbs, 4)
           for n, b in ((2, 64e3), (4, 256e3), (8, 1e6))]
    lat_us, bw = fit_op_cost(pts, 360.0, per_hop=True)
    assert lat_us == pytest.approx(90.0, rel=1e-6) and bw == pytest.approx(0.5, rel=1e-6)
    # all_reduce on 2 members: two hops (reduce-scatter, all-gather), one latency each
    one = [CollPoint("dp", "all_reduce", 2, 1024.0, 2 * hop_ns + 1024 / 360.0, 1)]
    assert fit_op_cost(one, 360.0, per_hop=True)[0] == pytest.approx(90.0)
    assert fit_op_cost(one, 360.0)[0] == pytest.approx(180.0)  # per op (NCCL-like tiers): the whole latency


def test_simulated_collective_pays_its_groups_hops_when_latency_is_per_hop():
    import dataclasses

    from tracekit.simulate import ClusterSpec, Faults, ParallelLayout, ModelSpec
    from tracekit.simulate.program import make_world

    model = ModelSpec("m", layers=2, hidden=64, heads=4, ffn=128, seq=32, vocab=128)
    cluster = dataclasses.replace(ClusterSpec("1x8-h100"), coll_costs=(("intra", "all_gather", 50.0, 1.0),))
    for per_hop, want_us in ((False, (50, 50)), (True, (50, 7 * 50))):
        cl = dataclasses.replace(cluster, coll_lat_per_hop=per_hop)
        got = []
        for dp in (2, 8):
            w = make_world(model, cl, ParallelLayout(dp=dp), Faults(), 0)
            g = w.topo.group(0, "dp")
            got.append(w.link(g, "all_gather")[0] / 1000)
        assert tuple(got) == want_us, (per_hop, got)
