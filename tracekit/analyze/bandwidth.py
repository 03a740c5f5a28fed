"""Collective bandwidth: algbw/busbw per collective instance, per group, op and size bucket.

NCCL-tests convention (DESIGN §3, docs/metrics.md): algbw = bytes / time; busbw = algbw × factor with
factor all_reduce 2(n−1)/n; all_gather, reduce_scatter, all_to_all, gather, scatter (n−1)/n; broadcast,
reduce, send/recv 1. `bytes` is the table's max(in, out) message size (NCCL-tests' "size": the whole
buffer). Time is the instance's device-side *transfer* time: first member's end − last member's
arrival (`matching.arrival_ns`: on GPU traces the start of the last member's collective kernel, so
neither the host's launch latency nor the wait for a late peer counts as transfer; NCCL-tests times
a whole collective from one host, which on a balanced group is the same interval). Exact int64 ns.
Without matching, an instance's shortest member duration (the last to arrive waits least) stands in
(`time_basis: "min_duration"`). Unknown bytes give no figure: such instances are counted in `unsized`
with the reason, never sized as one element.
P2P on GPU traces: each paired send/recv (`matching`: the k-th send src→dst with the k-th recv at dst)
is one `sendrecv` instance timed like a collective (first side's end − last side's arrival on the
device, factor 1), judged like the collectives, with its links (src → dst) listed per row; host-timed
P2P and barriers are tabulated from row durations but never flagged (those include the peer's schedule).

`low_bus_bandwidth`: a (group, op, size bucket) is low when even its fast quartile (75th percentile busbw)
is below — a slow link slows every call, CPU contention only some —
 - LOW_FRACTION_OF_PEAK × the peak the user gave for that group name or dim (`config.peak_gbps`),
   judged only for buckets ≥ PEAK_MIN_BYTES (small messages are latency-bound), or else
 - 1 / LOW_RATIO_OF_BEST of the best the same run reached: the fastest median time any (group, op,
   bucket) of the run over *other members* (another rank set, so another set of links) took to move
   at least as many bus bytes (bus bytes = bytes × factor, which puts the ops on one scale). The same
   ranks moving as much faster prove their links fine: the slow calls then met something else (on
   CPU, gloo threads starved by the backward pass they overlap), which `unoverlapped` reports.
Messages under MIN_JUDGED_BYTES are latency-bound and never judged.
The saving is the time above what the reference bandwidth would take, per step, bounded by the
exposed transfer time of the same (group, op, size bucket) on its worst rank (the `unoverlapped`
analyzer's instances, when it ran): a slow
collective hidden behind compute costs no step time (on CPU the gloo threads share cores with the
backward pass, so overlapped all-reduces run slower than exposed ones; GPU kernels that overlap
compute lose SMs the same way). Severity follows the bounded saving.

A slow host NIC: when one host is a member of every inter-host group judged low and of none judged
fine (`slow_host`; host names from the ranks table), the low dims whose groups all run through it are one
finding naming that host's ranks, with the dims and collectives it slows as evidence.

Section `bandwidth` (JSON):
{"time_basis": "transfer" | "min_duration",
 "unsized": [{"pg_name", "op", "count", "reason"}],     # instances without a known message size
 "rows": [{"pg_name", "dim", "op", "group_size", "bucket_bytes", "count", "bytes_p50", "time_ns_p50",
           "algbw_gbps_p50", "busbw_gbps_p50", "busbw_gbps_p75", "busbw_gbps_max", "time_ns_per_step",
           "reference_gbps": float | null, "reference": str | null, "low": bool,
           "links": [{"src", "dst", "count", "busbw_gbps_p50"}]}]}   # links: sendrecv rows only
   # bucket_bytes: the power of two at or below the message size; GB/s = 1e9 bytes/s
"""

from __future__ import annotations

import bisect
import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tracekit.analyze.unoverlapped import UnoverlappedResult
from tracekit.collectives import MIN_JUDGED_BYTES, bus_factor
from tracekit.config import AnalysisConfig
from tracekit.derive.matching import MatchedCollectives, MatchingResult, matched_of
from tracekit.derive.topology import LayoutResult, rank_hosts
from tracekit.findings import recommend
from tracekit.findings.evidence import BandwidthEvidence
from tracekit.findings.finding import Finding, FindingKind, Severity
from tracekit.findings.result import AnalyzerResult, section_of
from tracekit.tables.columns import table_rows
from tracekit.tables.store import RunStore

LOW_FRACTION_OF_PEAK = 0.5
LOW_RATIO_OF_BEST = 3.0
LOW_RATIO_OF_BEST_DEVICE = 2.0
"""... where every instance is timed on the device (GPU traces: NCCL kernels) and the reference is a
group of the same link tier (all members on one host, or spanning hosts): a healthy NCCL link of one
tier moves as many bytes in about the same time; half its speed is a slow link, not noise (the 3x of
`LOW_RATIO_OF_BEST` allows for gloo threads sharing CPU cores with compute)."""
PEAK_MIN_BYTES = 1 << 20
SAVING_INFO = 0.01
"""Lost time / step time below which a low-bandwidth group is not reported."""
SAVING_WARNING = 0.05
SAVING_CRITICAL = 0.20
NOT_FLAGGED_OPS = ("send", "recv", "barrier", "unknown")
UNSIZED_REASON = ("message size not recorded in the trace (e.g. a bucketed all-reduce over a TensorList "
                  "whose dims the profiler did not keep): no bandwidth figure")


def _bucket(nbytes: int) -> int:
    return 1 << int(math.floor(math.log2(nbytes))) if nbytes > 0 else 0


def link_tiers(store: RunStore, members: dict[str, tuple[int, ...] | None]) -> dict[str, str]:
    """Each group's link tier: "intra_host" when its members share one host name, "inter_host" when
    they span several; groups with a member of unknown host are left out."""
    hosts = rank_hosts(store)
    out = {}
    for pg, ranks in members.items():
        names = {hosts.get(r) for r in ranks or ()}
        if ranks and None not in names:
            out[pg] = "intra_host" if len(names) == 1 else "inter_host"
    return out


def _group_dims(store: RunStore, layout: dict[str, Any]) -> dict[str, str]:
    if layout and layout.get("groups"):
        return {g["pg_name"]: g["dim"] for g in layout["groups"]}
    return {g["pg_name"]: (g["dim"] or "unknown")
            for g in store.table("process_groups", ["pg_name", "dim"]).to_pylist()}


_COLUMNS = ("pg_name", "dim", "op", "n", "bytes", "time_ns", "link")
"""`_instances`' columns: one value per collective instance (`link`: (src, dst) of a P2P pair, else None)."""


def _instances(store: RunStore, matched: MatchedCollectives | None, layout: dict[str, Any]
               ) -> tuple[dict[str, list[Any]], str, list[dict[str, Any]]]:
    """The collective instances as columns (`_COLUMNS`: pg_name, dim, op, n, bytes, time_ns, link), the time
    basis, and the (group, op) counts left without a figure because their message size is unknown."""
    dims = _group_dims(store, layout)
    t = store.table("collectives", ["rank", "source", "pg_name", "seq", "op", "is_p2p", "bytes",
                                    "group_size", "dur", "step"])
    t = t.filter(pc.greater(t["dur"], 0))  # (null durations dropped too)
    out: dict[str, list[Any]] = {c: [] for c in _COLUMNS}
    unsized: dict[tuple[str, str], int] = defaultdict(int)
    if matched is not None and matched.n_instances:
        import pandas as pd  # only with matched instances: a run without any never imports it

        # a dict: Series.get per instance cost ~25 us each (98,624 instances at 1,024 ranks: ~2.5 s)
        nbytes = matched.rows.groupby("key")["bytes"].max().to_dict()
        # the columns read, each as Python values as itertuples gives them (without a tuple per instance
        # of every column: 10,000 ranks' instances)
        inst = matched.instances
        for t_ns, key, pg_name, op, gs, n_members, dim in zip(
                *(inst[c].tolist() for c in ("transfer", "key", "pg_name", "op", "group_size", "n", "dim"))):
            if t_ns is pd.NA or t_ns is None or int(t_ns) <= 0:
                continue
            b = nbytes.get(key)
            if b is None or b != b or not b:
                unsized[(pg_name, op)] += 1
                continue
            _append(out, pg_name, dim or dims.get(pg_name, "unknown"), op, int(gs) if gs == gs and gs else int(n_members),
                    int(b), int(t_ns), None)
        basis = "transfer"
        if _p2p_pair_instances(matched, dims, out):  # device-timed send/recv pairs: their transfer, as a collective's
            rows = []
        else:  # host-timed P2P: tabulated from row durations, never judged
            rows = table_rows(t.filter(_p2p_mask(t)))
    else:
        basis = "min_duration"
        rows = table_rows(t)
    for x in _unmatched_instances(rows, dims, unsized):
        _append(out, x["pg_name"], x["dim"], x["op"], x["n"], x["bytes"], x["time_ns"], None)
    unknown = [{"pg_name": pg, "op": op, "count": c, "reason": UNSIZED_REASON}
               for (pg, op), c in sorted(unsized.items())]
    return out, basis, unknown


def _append(out: dict[str, list[Any]], *values: Any) -> None:
    for c, v in zip(_COLUMNS, values):
        out[c].append(v)


def _p2p_mask(t) -> Any:
    """Rows that are P2P: flagged so, or a send / recv (a null flag or op counts as no)."""
    return pc.or_(pc.fill_null(t["is_p2p"], False),
                  pc.fill_null(pc.is_in(t["op"], pa.array(["send", "recv"])), False))


def _p2p_pair_instances(matched: MatchedCollectives, dims: dict[str, str], out: dict[str, list[Any]]) -> bool:
    """Add one `sendrecv` instance per paired send/recv to `out` when every pair is timed on the device (the
    link's transfer: first side's end − last side's arrival), with its link (src, dst); False (nothing added)
    when some P2P is host-timed (its duration then includes the peer's schedule)."""
    p = matched.p2p_pairs
    if p is None or not len(p) or not bool(p["device_timed"].all()):
        return False
    p = p[(p["transfer"] > 0) & p["bytes"].notna() & (p["bytes"] > 0)]
    pg = p["pg_name"].tolist()
    out["pg_name"] += pg
    out["dim"] += [dims.get(g, "unknown") for g in pg]
    out["op"] += ["sendrecv"] * len(pg)
    out["n"] += [2] * len(pg)
    out["bytes"] += [int(b) for b in p["bytes"].tolist()]
    out["time_ns"] += [int(x) for x in p["transfer"].tolist()]
    out["link"] += [(int(a), int(b)) for a, b in zip(p["src"].tolist(), p["dst"].tolist())]
    return True


def _unmatched_instances(rows: list[dict[str, Any]], dims: dict[str, str],
                         unsized: dict[tuple[str, str], int]) -> list[dict[str, Any]]:
    """Instances from row durations (no matching), counting those without a size in `unsized`."""
    # without matching: one source per rank (comms log preferred); an instance (pg_name, seq) takes the
    # shortest duration among its members (the last to arrive waits least: ≈ transfer time, no clocks)
    src_pref = ("comms-log", "flight-recorder", "kineto")
    have: dict[int, set[str]] = defaultdict(set)
    for r in rows:
        have[r["rank"]].add(r["source"])
    chosen = {rk: next((s for s in src_pref if s in ss), sorted(ss)[0]) for rk, ss in have.items()}
    by_inst: dict[Any, dict[str, Any]] = {}
    for i, r in enumerate(rows):
        if r["source"] != chosen[r["rank"]]:
            continue
        p2p = bool(r["is_p2p"]) or r["op"] in ("send", "recv")
        key = (r["pg_name"], r["seq"]) if r["seq"] is not None and r["pg_name"] and not p2p else ("row", i)
        if not r["bytes"]:
            if key not in by_inst:
                unsized[(r["pg_name"] or "?", r["op"])] += 1
            by_inst.setdefault(key, None)
            continue
        x = {"pg_name": r["pg_name"] or "?", "dim": dims.get(r["pg_name"], "unknown"), "op": r["op"],
             "n": int(r["group_size"] or 2), "bytes": int(r["bytes"]), "time_ns": int(r["dur"]),
             "step": r["step"]}
        cur = by_inst.get(key)
        if cur is None:
            by_inst[key] = x
        else:
            cur["time_ns"] = min(cur["time_ns"], x["time_ns"])
            cur["bytes"] = max(cur["bytes"], x["bytes"])
    return [x for x in by_inst.values() if x is not None]


def _step_ns(store: RunStore) -> tuple[float, int]:
    """Mean step time (slowest rank per step) and the number of steps."""
    per: dict[int, int] = defaultdict(int)
    for s in store.table("steps", ["step", "dur"]).to_pylist():
        if s["dur"] is not None:
            per[s["step"]] = max(per[s["step"]], s["dur"])
    if not per:
        return 0.0, 1
    return float(np.mean(list(per.values()))), len(per)


@dataclass(frozen=True)
class BandwidthResult(AnalyzerResult):
    pass


def analyze_bandwidth(store: RunStore, layout: LayoutResult | None, matching: MatchingResult | None,
                      unoverlapped: UnoverlappedResult | None, config: AnalysisConfig) -> BandwidthResult:
    """Bandwidth table and `low_bus_bandwidth` findings (one per dim)."""
    inst, basis, unsized = _instances(store, matched_of(matching), section_of(layout))
    step_ns, nsteps = _step_ns(store)
    table, groups = _table(inst, nsteps)
    members = {g["pg_name"]: tuple(sorted(g["ranks"])) if g["ranks"] else None
               for g in store.table("process_groups", ["pg_name", "ranks"]).to_pylist()}
    matched = matched_of(matching)
    device_timed = bool(matched is not None and matched.gpu_ranks
                        and (matched.n_rows == 0 or set(matched.rows["rank"].unique()) <= matched.gpu_ranks))
    tiers = link_tiers(store, members)
    _judge(table, groups, config.peak_gbps, nsteps, members, tiers, device_timed)
    findings = _findings(table, step_ns, store, _exposed_per_step(unoverlapped), tiers)
    for row in table:
        row.pop("bus_bytes_p50", None)
    return BandwidthResult(findings=findings, section={"time_basis": basis, "rows": table, "unsized": unsized})


@dataclass
class _Groups:
    """The instances (`_instances`' columns as arrays, each row's bus factor) and, per table row's key
    (pg_name, op, bucket), its instances' row numbers in instance order."""

    time_ns: np.ndarray
    bytes: np.ndarray
    factor: list
    rows: dict

    def lost_ns(self, key: tuple[str, str, int], ref: float) -> float:
        """The time the key's instances lost against `ref` GB/s, summed in instance order."""
        idx = self.rows[key].tolist()
        t, b = self.time_ns[idx].tolist(), self.bytes[idx].tolist()
        return sum(max(0.0, ti - bi * self.factor[i] / ref) for ti, bi, i in zip(t, b, idx))


def _table(inst: dict[str, list[Any]], nsteps: int) -> tuple[list[dict[str, Any]], _Groups]:
    """The bandwidth table: a row per (pg_name, op, size bucket) in that order, its figures over its
    instances: medians, the 75th percentile and the maximum of the bus bandwidth (numpy's median and
    linear percentile, computed for all rows at once over the instances sorted by row and value), the
    time per step; a sendrecv row's links."""
    n = len(inst["op"])
    t = np.array(inst["time_ns"], np.int64)
    b = np.array(inst["bytes"], np.int64)
    factors = {k: bus_factor(*k) for k in set(zip(inst["op"], inst["n"]))}
    factor = [factors[k] for k in zip(inst["op"], inst["n"])]
    gid, row_keys = _row_of(inst)
    ng = len(row_keys)
    order = np.argsort(gid, kind="stable")  # each row's instances, in instance order
    count = np.bincount(gid, minlength=ng)
    start = np.r_[0, np.cumsum(count)[:-1]].astype(np.int64)
    first = order[start] if n else np.zeros(0, np.int64)
    bf = b.astype(np.float64)
    has = np.array([f is not None for f in factor], bool)
    algbw = bf / t.astype(np.float64) if n else np.zeros(0)
    busbw = algbw * np.array([1.0 if f is None else f for f in factor], np.float64)
    med_t = _medians(t, gid, ng)
    med_b = _medians(bf, gid, ng)
    med_alg = _medians(algbw, gid, ng)
    sel = np.flatnonzero(has)
    nbus = np.bincount(gid[sel], minlength=ng)
    med_bus = _medians(busbw[sel], gid[sel], ng)
    p75_bus = _percentiles(busbw[sel], gid[sel], ng, 75)
    max_bus = np.full(ng, -np.inf)
    np.maximum.at(max_bus, gid[sel], busbw[sel])
    sums = np.add.reduceat(t[order], start) if n else np.zeros(0, np.int64)
    table = []
    for g in range(ng):
        pg, op, bucket = row_keys[g]
        i0 = int(first[g])
        f = factor[i0]
        busy = nbus[g] > 0
        table.append({
            "pg_name": pg, "dim": inst["dim"][i0], "op": op, "group_size": inst["n"][i0], "bucket_bytes": bucket,
            "count": int(count[g]), "bytes_p50": int(med_b[g]), "time_ns_p50": int(med_t[g]),
            "algbw_gbps_p50": float(med_alg[g]),
            "busbw_gbps_p50": float(med_bus[g]) if busy else None,
            "busbw_gbps_p75": float(p75_bus[g]) if busy else None,
            "busbw_gbps_max": float(max_bus[g]) if busy else None,
            "time_ns_per_step": float(np.int64(sums[g]) / nsteps),
            "bus_bytes_p50": float(med_b[g] * f) if f is not None else None,
            "reference_gbps": None, "reference": None, "low": False, "lost_ns_per_step": 0.0,
        })
    rows = {row_keys[g]: order[a:a + c] for g, (a, c) in enumerate(zip(start.tolist(), count.tolist()))}
    links = [g for g in range(ng) if table[g]["op"] == "sendrecv"]
    if links:
        _links(table, links, rows, [row_keys[g] for g in links], inst["link"], busbw)
    return table, _Groups(time_ns=t, bytes=b, factor=factor, rows=rows)


def _row_of(inst: dict[str, list[Any]]) -> tuple[np.ndarray, list[tuple[str, str, int]]]:
    """Each instance's table row (numbered in the rows' key order) and the rows' keys (pg_name, op, size bucket)
    in that order (Python's sort of the key tuples)."""
    buckets = {x: _bucket(x) for x in set(inst["bytes"])}
    keys = zip(inst["pg_name"], inst["op"], (buckets[x] for x in inst["bytes"]))
    index: dict[tuple, int] = {}
    first_id = np.fromiter((index.setdefault(k, len(index)) for k in keys), np.int64, len(inst["op"]))
    distinct = list(index)
    by_key = sorted(range(len(distinct)), key=distinct.__getitem__)
    place = np.empty(len(distinct), np.int64)
    place[by_key] = np.arange(len(distinct))
    return place[first_id], [distinct[i] for i in by_key]


def _sorted_by_group(values: np.ndarray, gid: np.ndarray, ng: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The values sorted by group, then value; each group's first position and count."""
    o = np.lexsort((values, gid))
    count = np.bincount(gid, minlength=ng)
    return values[o], np.r_[0, np.cumsum(count)[:-1]].astype(np.int64), count


def _medians(values: np.ndarray, gid: np.ndarray, ng: int) -> np.ndarray:
    """Per group, np.median of its values (float64; NaN for a group without any): the middle value, or the
    mean of the two middle ones ((a + b) / 2 in float64, as numpy computes it)."""
    v, start, count = _sorted_by_group(values, gid, ng)
    out = np.full(ng, np.nan)
    ok = count > 0
    mid = start[ok] + count[ok] // 2
    hi = v[mid].astype(np.float64)
    lo = v[np.where(count[ok] % 2 == 1, mid, mid - 1)].astype(np.float64)
    out[ok] = np.where(count[ok] % 2 == 1, hi, (lo + hi) / 2)
    return out


def _percentiles(values: np.ndarray, gid: np.ndarray, ng: int, q: int) -> np.ndarray:
    """Per group, np.percentile(values, q) (numpy's "linear" method, the same float64 steps: the virtual
    index (n - 1) * q / 100, its floor and fraction, and numpy's two-sided interpolation `_lerp`)."""
    v, start, count = _sorted_by_group(values, gid, ng)
    out = np.full(ng, np.nan)
    ok = count > 0
    n = count[ok]
    virtual = (n - 1) * np.true_divide(q, 100)
    prev = np.floor(virtual)
    above = virtual >= n - 1  # one value: numpy takes the last one on both sides
    prev_i = np.where(above, n - 1, prev.astype(np.int64))
    next_i = np.where(above, n - 1, prev_i + 1)
    gamma = virtual - np.where(above, -1.0, prev)
    a, b = v[start[ok] + prev_i], v[start[ok] + next_i]
    diff = b - a
    res = a + diff * gamma
    res = np.where(gamma >= 0.5, b - diff * (1 - gamma), res)
    out[ok] = res
    return out


def _links(table: list[dict[str, Any]], where: list[int], rows: dict, keys: list, link: list, busbw: np.ndarray
           ) -> None:
    """Each sendrecv row's `links`: per P2P link (src → dst), its transfers and median bus bandwidth, slowest
    first."""
    for g, key in zip(where, keys):
        idx = rows[key]
        per: dict[tuple[int, int], list[float]] = defaultdict(list)
        bw = busbw[idx].tolist()
        for i, x in zip(idx.tolist(), bw):
            per[link[i]].append(x)
        table[g]["links"] = sorted(({"src": a, "dst": b_, "count": len(v), "busbw_gbps_p50": float(np.median(v))}
                                    for (a, b_), v in per.items()),
                                   key=lambda d: (d["busbw_gbps_p50"], d["src"], d["dst"]))


def _judge(table: list[dict[str, Any]], groups, peaks: dict[str, float], nsteps: int,
           members: dict[str, tuple[int, ...] | None] | None = None,
           tiers: dict[str, str] | None = None, device_timed: bool = False) -> None:
    """Fill reference bandwidth, `low` and the time lost against the reference per row. `tiers`: a
    group's link tier ("intra_host" / "inter_host", absent when its hosts are unknown): the best of
    the run is taken from groups of the same tier only."""
    members, tiers = members or {}, tiers or {}

    def links(pg: str) -> Any:  # a group's member set (its name when the members are unknown)
        return members.get(pg) or pg

    judged = [r for r in table if r["op"] not in NOT_FLAGGED_OPS and r["busbw_gbps_p50"] is not None
              and r["bytes_p50"] >= MIN_JUDGED_BYTES]
    link_id: dict[Any, int] = {}
    lid = [link_id.setdefault(links(r["pg_name"]), len(link_id)) for r in judged]
    by_tier: dict[Any, list[tuple[int, dict[str, Any]]]] = {}
    for i, r in zip(lid, judged):  # in `judged` order
        by_tier.setdefault(tiers.get(r["pg_name"]), []).append((i, r))
    best_in = {tier: _TierBest(rows) for tier, rows in by_tier.items()}
    for mine, row in zip(lid, judged):
        peak = peaks.get(row["pg_name"], peaks.get(row["dim"]))
        if peak is not None:
            if row["bucket_bytes"] < PEAK_MIN_BYTES:
                continue
            ref, why, low_at = float(peak), f"peak given for {row['pg_name'] if row['pg_name'] in peaks else row['dim']}", \
                LOW_FRACTION_OF_PEAK
        else:
            # other links of the same tier
            better, smaller = best_in[tiers.get(row["pg_name"])].best(row["bus_bytes_p50"], mine)
            found = _best_of_run(row, better, smaller if device_timed and tiers.get(row["pg_name"]) else None)
            if found is None:
                continue
            ref, why = found
            low_at = 1.0 / (LOW_RATIO_OF_BEST_DEVICE if device_timed and tiers.get(row["pg_name"])
                            else LOW_RATIO_OF_BEST)
        row["reference_gbps"], row["reference"] = ref, why
        if row["busbw_gbps_p75"] < low_at * ref:
            row["low"] = True
            lost = groups.lost_ns((row["pg_name"], row["op"], row["bucket_bytes"]), ref)
            row["lost_ns_per_step"] = lost / nsteps


class _TierBest:
    """Over the judged rows of one link tier (each with its link id, in `judged` order): for a row moving
    `x` bus bytes on link `mine`, the other links' row with the fastest median time among those moving at
    least `x` and the one with the best median busbw among those moving fewer, the first in order on a tie
    (as min / max over the list would pick). Rows sorted by bus bytes once, each prefix / suffix keeping
    its best two rows of distinct links: O(rows log rows) where a scan of the tier per row was quadratic
    (thousands of groups at thousands of ranks)."""

    def __init__(self, rows: list[tuple[int, dict[str, Any]]]) -> None:
        order = sorted(range(len(rows)), key=lambda j: -rows[j][1]["bus_bytes_p50"])
        self.neg_bytes = [-rows[j][1]["bus_bytes_p50"] for j in order]  # ascending
        self.prefix, top = [], ()
        for j in order:
            top = _push_best(top, ((rows[j][1]["time_ns_p50"], j), rows[j][0], rows[j][1]))
            self.prefix.append(top)
        self.suffix, top = [()] * (len(order) + 1), ()
        for k in range(len(order) - 1, -1, -1):
            j = order[k]
            top = _push_best(top, ((-rows[j][1]["busbw_gbps_p50"], j), rows[j][0], rows[j][1]))
            self.suffix[k] = top

    def best(self, x: float, mine: int) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
        k = bisect.bisect_right(self.neg_bytes, -x)  # rows [0, k) move >= x bus bytes
        at_least = self.prefix[k - 1] if k else ()
        return (next((r for _, link, r in at_least if link != mine), None),
                next((r for _, link, r in self.suffix[k] if link != mine), None))


def _push_best(top: tuple, cand: tuple) -> tuple:
    """The best (smallest key) entry of each of the two best links, after adding `cand` (key, link, row)."""
    same = [e for e in top if e[1] == cand[1]]
    if same:
        keep = [e for e in top if e[1] != cand[1]] + [min(same[0], cand, key=lambda e: e[0])]
    else:
        keep = [*top, cand]
    return tuple(sorted(keep, key=lambda e: e[0])[:2])


def _best_of_run(row: dict[str, Any], best: dict[str, Any] | None, smaller_best: dict[str, Any] | None
                 ) -> tuple[float, str] | None:
    """Reference bandwidth for a row from other groups' rows: the fastest median time any of them took to
    move at least as many bus bytes (`best`); when given (device-timed, same link tier) also the best
    median busbw of those moving fewer (`smaller_best`: bus bandwidth grows with message size on one NCCL
    link, so a smaller message's is a lower bound for a larger one's: this judges the dim that moves the most)."""
    refs = []
    if best is not None:
        refs.append((row["bus_bytes_p50"] / best["time_ns_p50"],
                     f"best of the run: {best['pg_name']} {best['op']} moved ≥ as many bus bytes "
                     f"({best['bytes_p50']} B) in {best['time_ns_p50'] / 1e3:.0f} µs"))
    if smaller_best is not None:
        best = smaller_best
        refs.append((best["busbw_gbps_p50"], f"best of the run: {best['pg_name']} {best['op']} reached "
                     f"{best['busbw_gbps_p50']:.1f} GB/s with fewer bus bytes ({best['bytes_p50']} B) on the same link tier"))
    return max(refs, key=lambda x: x[0]) if refs else None


def _exposed_per_step(unoverlapped: UnoverlappedResult | None) -> Callable[[str, str, str, list[int]], float] | None:
    """Exposed transfer time per step of a (group, op) and size buckets, on the worst rank, from the
    `unoverlapped` analyzer's instances (falls back to its (dim, op) figure for instances without a
    size); None when it did not run."""
    if unoverlapped is None or unoverlapped.section is None:
        return None
    inst, sec = unoverlapped.instances, unoverlapped.section
    by_dim_op = {(str(r["dim"] or "unknown"), r["op"]): float(r.get("transfer_exposed_ns_per_step") or 0.0)
                 for r in sec.get("by_dim_op", [])}
    sized = inst.filter(pc.is_valid(inst["bytes"]))
    pg, ops = np.array(sized["pg_name"].to_pylist(), object), np.array(sized["op"].to_pylist(), object)
    nbytes, ranks = sized["bytes"].to_numpy(), sized["rank"].to_numpy()
    per_step = sized["transfer_exposed_ns"].to_numpy() / np.maximum(sized["steps"].to_numpy(), 1)

    def bound(pg_name: str, dim: str, op: str, buckets: list[int]) -> float:
        if op == "sendrecv":  # a pair's two sides: each rank's sends or receives, whichever is more exposed
            return max(bound(pg_name, dim, "send", buckets), bound(pg_name, dim, "recv", buckets))
        mine = (pg == pg_name) & (ops == op)
        if not mine.any():
            return by_dim_op.get((dim, op), 0.0)
        mine &= np.array([_bucket(int(b)) in buckets for b in nbytes], bool)
        if not mine.any():
            return 0.0
        per_rank: dict[int, float] = {}
        for r, x in zip(ranks[mine].tolist(), per_step[mine].tolist()):
            per_rank[r] = per_rank.get(r, 0.0) + x
        return max(per_rank.values())
    return bound


def _severity(frac: float) -> Severity:
    return Severity.CRITICAL if frac >= SAVING_CRITICAL else Severity.WARNING if frac >= SAVING_WARNING \
        else Severity.INFO


def _dim_loss(dim: str, rows: list[dict[str, Any]], exposed) -> dict[str, Any]:
    """A dim's low groups: time lost per group, the worst group and row, its exposure bound and the
    saving (lost time, at most the exposed transfer time when known)."""
    per_group: dict[str, float] = defaultdict(float)
    for r in rows:
        per_group[r["pg_name"]] += r["lost_ns_per_step"]
    worst_pg = max(per_group, key=per_group.get)
    lost = per_group[worst_pg]  # groups of one dim run side by side: the worst bounds the step
    bound = None
    if exposed is not None:
        mine = [r for r in rows if r["pg_name"] == worst_pg]
        bound = sum(exposed(worst_pg, dim, op, [r["bucket_bytes"] for r in mine if r["op"] == op])
                    for op in {r["op"] for r in mine})
    worst = max((r for r in rows if r["pg_name"] == worst_pg), key=lambda r: r["lost_ns_per_step"])
    return {"dim": dim, "per_group": dict(per_group), "worst_pg": worst_pg, "lost": lost, "bound": bound,
            "saving": lost if bound is None else min(lost, bound), "worst": worst}


def _findings(table: list[dict[str, Any]], step_ns: float, store: RunStore,
              exposed: Callable[[str, str, str, list[int]], float] | None = None,
              tiers: dict[str, str] | None = None) -> list[Finding]:
    by_dim: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in table:
        if r["low"]:
            by_dim[r["dim"] or "unknown"].append(r)
    pg_ranks = {g["pg_name"]: g["ranks"] or [] for g in store.table("process_groups", ["pg_name", "ranks"]).to_pylist()}
    losses = [_dim_loss(dim, rows, exposed) for dim, rows in by_dim.items()]
    losses = [x for x in losses if not step_ns or x["saving"] / step_ns >= SAVING_INFO]
    host = slow_host(table, pg_ranks, tiers or {}, rank_hosts(store))
    on_host = [x for x in losses if host is not None and set(x["per_group"]) <= host["groups"]]
    out = [_host_finding(host, on_host, step_ns)] if on_host else []
    for x in losses:
        if x in on_host:
            continue
        dim, worst, lost, bound = x["dim"], x["worst"], x["lost"], x["bound"]
        advice = recommend.advise_bandwidth(group=x["worst_pg"], dim=dim, busbw_gbps=worst["busbw_gbps_p50"],
                                            reference_gbps=worst["reference_gbps"], reference=worst["reference"],
                                            lost_ns=lost, exposed_bound_ns=bound)
        ranks = sorted({rk for pg in x["per_group"] for rk in pg_ranks.get(pg, [])})
        summary = (f"{dim} collectives reach {worst['busbw_gbps_p50']:.3f} GB/s bus bandwidth "
                   f"({worst['op']}, ~{worst['bytes_p50']} B) vs {worst['reference_gbps']:.3f} GB/s reference; "
                   f"{lost / 1e6:.1f} ms lost per step"
                   + (f", {x['saving'] / 1e6:.1f} ms of it exposed" if bound is not None and bound < lost else ""))
        evidence = {"groups": sorted(x["per_group"]), "lost_ns_per_step": {k: int(v) for k, v in x["per_group"].items()},
                    "op": worst["op"], "bucket_bytes": worst["bucket_bytes"],
                    "busbw_gbps": worst["busbw_gbps_p50"], "reference_gbps": worst["reference_gbps"],
                    "reference": worst["reference"], "step_ns": int(step_ns),
                    "exposed_bound_ns_per_step": None if bound is None else int(bound), **advice.evidence}
        if worst.get("links"):
            evidence["links"] = worst["links"]
        out.append(Finding(kind=FindingKind.LOW_BUS_BANDWIDTH, severity=_severity(x["saving"] / step_ns if step_ns else 0.0),
                           summary=summary, ranks=tuple(ranks), dim=dim, evidence=BandwidthEvidence.of(evidence),
                           recommendation=advice.text, est_saving_ns=int(advice.saving_ns)))
    return out


def slow_host(table: list[dict[str, Any]], pg_ranks: dict[str, list[int]], tiers: dict[str, str],
              hosts: dict[int, str]) -> dict[str, Any] | None:
    """The one host whose NIC explains the low inter-host groups: a member of every inter-host group
    judged low and of none judged fine (a slow NIC slows every ring or pair through that host, and
    only those). {"host", "ranks", "groups" (the low groups through it)}; None when no single host
    does (or host names are unknown)."""
    judged = [r for r in table if r["reference_gbps"] is not None and tiers.get(r["pg_name"]) == "inter_host"]
    low = {r["pg_name"] for r in judged if r["low"]}
    fine = {r["pg_name"] for r in judged} - low
    if not low or not fine:
        return None

    def host_set(pg: str) -> set[str]:
        return {hosts[rk] for rk in pg_ranks.get(pg, []) if rk in hosts}

    cand = set.intersection(*(host_set(pg) for pg in low)) - set().union(*(host_set(pg) for pg in fine))
    if len(cand) != 1:
        return None
    (name,) = cand
    return {"host": name, "ranks": sorted(rk for rk, h in hosts.items() if h == name), "groups": low}


def _host_finding(host: dict[str, Any], losses: list[dict[str, Any]], step_ns: float) -> Finding:
    """One finding for the dims a slow host NIC slows: its ranks, the collectives and dims as evidence."""
    saving = min(sum(x["saving"] for x in losses), step_ns) if step_ns else sum(x["saving"] for x in losses)
    top = max(losses, key=lambda x: x["saving"])
    dims = {x["dim"]: {"groups": sorted(x["per_group"]), "op": x["worst"]["op"],
                       "busbw_gbps": x["worst"]["busbw_gbps_p50"], "reference_gbps": x["worst"]["reference_gbps"],
                       "lost_ns_per_step": int(x["lost"]), "saving_ns_per_step": int(x["saving"])} for x in losses}
    text = ", ".join(f"{d} {v['op']} {v['busbw_gbps']:.1f} vs {v['reference_gbps']:.1f} GB/s" for d, v in dims.items())
    evidence = BandwidthEvidence(
        op=top["worst"]["op"], reference_gbps=top["worst"]["reference_gbps"],
        exposed_bound_ns_per_step=None if top["bound"] is None else int(top["bound"]), host=host["host"],
        slow_dims={d: v["lost_ns_per_step"] for d, v in dims.items()},
        saving_formula="Σ over the dims it slows of min(lost, exposed transfer) per step",
        details={"dims": dims, "groups": sorted(host["groups"]), "step_ns": int(step_ns)})
    return Finding(
        kind=FindingKind.LOW_BUS_BANDWIDTH, severity=_severity(saving / step_ns if step_ns else 0.0),
        summary=(f"host {host['host']}'s inter-host links are slow: every inter-host group through it is low "
                 f"and none without it ({text}); {saving / 1e6:.1f} ms per step"),
        ranks=tuple(host["ranks"]), dim=top["dim"], evidence=evidence,
        recommendation=(f"Check host {host['host']}'s NIC (link speed, errors, PCIe/NUMA placement, "
                        "NCCL_IB_HCA) — its groups' peers on other hosts reach the reference bandwidth."),
        est_saving_ns=int(saving))
