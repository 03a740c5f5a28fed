"""Cross-rank matching of collective instances: arrival skew vs transfer time (DESIGN §3).

An instance is one collective call seen by every member of its group, keyed by `pg_name` + `seq`
(when a source has no seq, by position within the group on each rank, `seq_basis: "order"`, and
only when the ops at each position agree). P2P ops are not collective instances (their seq counters
are per rank, not per group); instead each send is paired with its receive (the k-th send from src
to dst on a group with the k-th recv at dst from src, by arrival order) and the earlier side's time
until the later side was issued counts as waiting for a late peer (gloo/NCCL move the data only
once both sides are posted), like a collective's wait, so exposed-transfer figures exclude it.
Arrival (DESIGN §3, `arrival_ns`): on GPU ranks the start of the rank's collective on the device (`ts`:
its NCCL/RCCL kernel, or the log's start) — never the host's enqueue, which runs ahead of the device
by up to a step; on CPU backends the op's start on the host (`enqueue_ts`, else `ts`). end = ts + dur.
Skew = last arrival − first arrival; transfer = first member's end − last arrival (all members of an
NCCL collective finish together; the first end is the least delayed by its own rank); a rank's wait =
last arrival − its own arrival; the late rank's delay = last arrival − second-to-last arrival,
counted from the group's previous collective's end and at most its extra gap since its own previous
collective (`_late_delay`); comms-log rows without an end take the profiler's (`fill_log_ends`).
Times are exact int64 ns throughout.
Rows the trace files under no process group are left out of cross-rank matching (counted in
`no_group`): pairing them by order under a guessed group pairs different steps' calls.

One source per rank, consistently: the comms log when every rank has one (it carries seq), else
flight-recorder dumps, else Kineto; a rank lacking the chosen source falls back to the best it has
(`source.method: "mixed"`). Kineto collectives the log never saw (torch-internal calls, e.g.
DDP's buffer broadcast; the parser leaves them unjoined) are matched too, among themselves, as
groups `kineto:<pg_name or ?>`. Times stay on each source's clock for matching (the parser puts
log times on the trace clock when it can); per-rank clock offsets
are estimated here (see clocks.py) and subtracted before skew is computed.

Section `matching`:
    {"source": {"method": "uniform|mixed|none", "per_rank": {rank: source}},
     "supplement": {"kineto collectives without a log entry": int},
     "seq_basis": {"args|log|order": count of instances},
     "instances": int, "matched": int (≥ 2 ranks), "complete": int (whole group),
     "op_mismatches": int, "p2p_skipped": int, "no_group": int, "no_device_time": int,
     "warnings": [str],            # the integrity counts above in words (also in analysis.json inputs.warnings)
     "p2p": {"pairs": int, "unpaired": int, "wait_ns": int},
     "by_group": [{"pg_name", "dim", "op", "instances", "skew_ns": {"mean", "p50", "p95", "max"},
                   "transfer_ns": {"mean", "p50", "p95", "max"}}],
     "per_rank": [{"rank", "instances", "last_count", "delay_ns", "wait_ns"}],
     "top_skew": [{"pg_name", "dim", "seq", "op", "step", "skew_ns", "transfer_ns", "first_rank",
                   "last_rank", "delay_ns"}]}          # the 20 largest skews
Result for later analyzers: `MatchingResult` — `matched` (MatchedCollectives) and `clocks` (the
clock estimate the `clocks` analyzer publishes).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from tracekit.analyze import intervals as iv
from tracekit.analyze.clocks import ClockConfig, estimate_offsets, log_to_trace_shift
from tracekit.analyze.base import AnalyzerResult
from tracekit.analyze.layout import LayoutResult, dims_of
from tracekit.tables.store import RunStore

SOURCE_PRIORITY = ("comms-log", "flight-recorder", "kineto")
LOG_SOURCES = ("comms-log", "flight-recorder")
COLUMNS = ["rank", "source", "pg_name", "seq", "seq_source", "op", "is_p2p", "bytes", "ts", "dur",
           "enqueue_ts", "caller", "step", "group_size", "peer"]


@dataclass
class MatchedCollectives:
    """Per (instance, rank) rows with corrected times, plus per-instance aggregates.

    Times are exact int64 ns on the matching clock (nullable ones, e.g. end, as pandas Int64); other
    nullable numbers (step, bytes, group_size) are float64 NaN."""

    rows: pd.DataFrame
    """key, pg_name, seq, op, rank, arrival (offset-corrected), arrival_raw, end, wait, is_last, source,
    step, caller, bytes."""
    instances: pd.DataFrame
    """key, pg_name, dim, seq, op, step, n, first, last, second_last, first_end, last_end, skew, transfer,
    first_rank, last_rank, delay."""
    trace_shift: dict[int, int | None]
    """Per rank: add to this rank's raw matching times to put them on its trace clock (None: unknown)."""
    wait_intervals: dict[int, "iv.IntervalSet"]
    """Per rank, trace clock: waiting for the group's last arrival, or for a P2P op's peer to post the
    other side (ranks with a known shift only)."""
    gpu_ranks: set[int] = field(default_factory=set)
    """Ranks with device kernels: their arrival is the device start (`arrival_ns`)."""
    p2p_pairs: pd.DataFrame | None = None
    """One row per paired send/recv (`_pair_p2p`): pg_name, src, dst, bytes, step (float64, NaN when
    unknown), device_timed (both sides on GPU ranks) and transfer (int64 ns, matching clock: the first
    side's end − the last side's arrival, as a collective's transfer)."""


def gpu_ranks(store: RunStore) -> set[int]:
    """Ranks whose trace has device kernels (ranks.trace_kind == "gpu")."""
    t = store.table("ranks", ["rank", "trace_kind"]).to_pylist()
    return {r["rank"] for r in t if r["trace_kind"] == "gpu"}


def arrival_ns(rows: pd.DataFrame, on_gpu: set[int]) -> pd.Series:
    """A rank's arrival at each collective row (DESIGN §3), Int64 ns on the row's clock: on GPU ranks
    the collective's start on the device (`ts`), null when unknown — never the host's enqueue; on
    CPU backends the op's start on the host (`enqueue_ts`, else `ts`)."""
    gpu = rows["rank"].isin(on_gpu).to_numpy()
    host = rows["enqueue_ts"].fillna(rows["ts"])
    return rows["ts"].where(gpu, host).astype("Int64")


def load_collectives(store: RunStore) -> pd.DataFrame:
    t = store.table("collectives", COLUMNS)
    cols = {}
    for name in t.column_names:
        col = t.column(name)
        if pa.types.is_dictionary(col.type):
            col = col.cast(pa.string())
        cols[name] = col
    # nullable ints straight to pandas Int64: through float64 (pandas' default for a column with nulls)
    # epoch-scale ns would round to 256 ns
    nullable = {pa.int64(): pd.Int64Dtype(), pa.int32(): pd.Int32Dtype()}
    df = pa.table(cols).to_pandas(types_mapper=nullable.get)
    for c in ("ts", "dur", "enqueue_ts", "seq", "bytes", "step"):
        df[c] = df[c].astype("Int64")
    return df


def choose_sources(df: pd.DataFrame, on_gpu: set[int] | None = None) -> tuple[dict[int, str], str]:
    """One collective source per rank (see module doc). On GPU ranks (`on_gpu`) a source counts only
    with device start times (a log that holds only enqueue times cannot give an arrival there)."""
    host_ok = df["enqueue_ts"].notna() & ~df["rank"].isin(on_gpu or set())
    usable = df[host_ok | df["ts"].notna()]
    have: dict[str, set[int]] = {s: set(g["rank"].tolist()) for s, g in usable.groupby("source")}
    ranks = set(usable["rank"].tolist())
    if not ranks:
        return {}, "none"
    for src in SOURCE_PRIORITY:
        if have.get(src, set()) == ranks:
            return {r: src for r in sorted(ranks)}, "uniform"
    per_rank = {}
    for r in sorted(ranks):
        per_rank[r] = next(s for s in SOURCE_PRIORITY + tuple(sorted(have)) if r in have.get(s, set()))
    return per_rank, "mixed"


def _stats(x: pd.Series) -> dict[str, int]:
    a = x.dropna().to_numpy(dtype=float)
    if a.size == 0:
        return {"mean": 0, "p50": 0, "p95": 0, "max": 0}
    return {"mean": int(a.mean()), "p50": int(np.percentile(a, 50)), "p95": int(np.percentile(a, 95)),
            "max": int(a.max())}


def host_count(store: RunStore) -> int | None:
    """Distinct hosts of the run's ranks (ranks table, else manifest), None when unknown."""
    names = store.table("ranks", ["hostname"]).column("hostname").to_pylist()
    if names and all(names):
        return len(set(names))
    hosts = (store.manifest or {}).get("hosts")
    if isinstance(hosts, dict) and hosts:
        return len(set(hosts.values()))
    return None


def _trace_shifts(store: RunStore, per_rank: dict[int, str]) -> tuple[dict[int, int | None], list[dict[str, Any]]]:
    """Shift per rank from its matching source's clock to its trace clock."""
    rows = {r["rank"]: r for r in store.table("ranks", ["rank", "first_ts", "last_ts", "base_time_ns"]).to_pylist()}
    shifts: dict[int, int | None] = {}
    report = []
    for r, src in per_rank.items():
        if src not in LOG_SOURCES:
            shifts[r] = 0
            continue
        t = store.rank_table("collectives", r, ["source", "enqueue_ts", "ts"])
        t = t.filter(pc.equal(t["source"].cast(pa.string()), src))
        times = pc.drop_null(pa.concat_arrays([t["enqueue_ts"].combine_chunks(), t["ts"].combine_chunks()])
                             ).to_numpy(zero_copy_only=False).astype(np.int64)
        row = rows.get(r, {})
        shift, how = log_to_trace_shift(times, row.get("first_ts"), row.get("last_ts"), row.get("base_time_ns"))
        shifts[r] = shift if how != "unaligned" else None
        report.append({"rank": r, "shift_ns": shift, "method": how})
    return shifts, report


NO_CLOCKS: dict[str, Any] = {"method": "none", "reference_rank": None, "ranks": [], "log_to_trace": []}


def _empty_section(section: dict[str, Any]) -> dict[str, Any]:
    section.update({"seq_basis": {}, "instances": 0, "matched": 0, "complete": 0, "op_mismatches": 0,
                    "p2p_skipped": 0, "no_group": 0, "no_device_time": 0, "p2p": {"pairs": 0, "unpaired": 0, "wait_ns": 0},
                    "by_group": [], "per_rank": [], "top_skew": []})
    return section


def fill_log_ends(df: pd.DataFrame, shifts: dict[int, int | None]) -> pd.DataFrame:
    """`df` with each row's `end` (ts + dur). Log rows that carry none (a CPU comms log holds enqueue
    times only) take the end of the profiler's record of the same call (rank, group, p2p, seq; the
    parser joined the two), moved onto the log's clock (`shifts`: log + shift = trace; unknown: no
    fill). Without it the delay rule "count from the group's previous collective's end" cannot apply,
    and each async call queued behind a running one adds its queueing skew to the late rank's delay."""
    df = df.assign(end=(df["ts"] + df["dur"]).astype("Int64"),
                   p2p=df["is_p2p"].astype("boolean").fillna(False).astype(bool))
    keys = ["rank", "pg_name", "p2p", "seq"]
    kin = df[(df["source"] == "kineto") & df["seq_source"].isin(["args", "log"]) & df["end"].notna()]
    kin = kin[keys + ["end"]].drop_duplicates(keys, keep=False).rename(columns={"end": "kin_end"})
    need = df["source"].isin(LOG_SOURCES) & df["end"].isna() & df["seq"].notna() & df["pg_name"].notna()
    found = df.loc[need, keys].reset_index().merge(kin, on=keys, how="inner").set_index("index")
    shift = found["rank"].map(shifts).astype("Int64")
    df.loc[found.index, "end"] = (found["kin_end"] - shift).astype("Int64")  # NA where the shift is unknown
    return df.drop(columns="p2p")


def _select_rows(df: pd.DataFrame, per_rank: dict[int, str], on_gpu: set[int], section: dict[str, Any]
                 ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Each rank's rows from its chosen source with their arrival, keyed by instance (pg_name#seq),
    and its P2P rows (`df` holds each row's `end`, see `fill_log_ends`)."""
    chosen = df["rank"].map(per_rank)
    # collectives the log never saw (torch-internal calls such as DDP's buffer broadcast): the parser
    # leaves their Kineto rows unjoined (seq numbered by order); match them among themselves
    extra = ((df["source"] == "kineto") & (df["seq_source"] == "order") & chosen.isin(LOG_SOURCES))
    section["supplement"] = {"kineto collectives without a log entry": int(extra.sum())}
    df = df[(df["source"] == chosen) | extra].copy()
    ex_idx = extra[extra].index.intersection(df.index)
    df.loc[ex_idx, "pg_name"] = ("kineto:" + df.loc[ex_idx, "pg_name"].astype(str)).where(
        df.loc[ex_idx, "pg_name"].notna(), None)
    p2p = df["is_p2p"].astype("boolean").fillna(False).astype(bool) | df["op"].isin(["send", "recv"])
    section["p2p_skipped"] = int(p2p.sum())
    p2p_df = df[p2p].copy()
    p2p_df["arrival"] = arrival_ns(p2p_df, on_gpu)
    df = df[~p2p].copy()
    # never matched by order under a guessed group: a row without a group stays out of matching
    section["no_group"] = int(df["pg_name"].isna().sum())
    df = df[df["pg_name"].notna()].copy()
    df["arrival"] = arrival_ns(df, on_gpu)
    section["no_device_time"] = int((df["arrival"].isna() & df["rank"].isin(on_gpu)).sum())
    df = df[df["arrival"].notna()].copy()
    # seq: from the source, else by order within (rank, group)
    df = df.sort_values(["rank", "pg_name", "arrival"], kind="stable")
    order = df.groupby(["rank", "pg_name"]).cumcount() + 1
    df["seq_basis"] = np.where(df["seq"].notna(), df["seq_source"].fillna("args"), "order")
    df["seq"] = df["seq"].fillna(pd.Series(order, index=df.index)).astype("int64")
    df["key"] = df["pg_name"].astype(str) + "#" + df["seq"].astype(str)

    # ops must agree within an instance; drop instances where they do not
    nops = df.groupby("key")["op"].transform("nunique")
    section["op_mismatches"] = int(df.loc[nops > 1, "key"].nunique())
    df = df[nops <= 1].copy()
    n = df.groupby("key")["rank"].transform("size")
    return df[n >= 2].copy(), p2p_df


def _estimate_clocks(store: RunStore, df: pd.DataFrame, log_report: list[dict[str, Any]]
                     ) -> tuple[dict[str, Any], dict[int, int]]:
    """Clock offsets estimated on the matching clock (`log_report`: each rank's log-to-trace shift)."""
    anchors = {r["rank"]: r["clock_offset_ns"] for r in store.table("ranks", ["rank", "clock_offset_ns"]).to_pylist()}
    clk_in = pd.DataFrame({"key": df["key"], "rank": df["rank"], "op": df["op"], "end": df["end"]})
    hosts = host_count(store)
    clocks, offsets = estimate_offsets(clk_in, anchors, ClockConfig(), same_host=hosts == 1)
    clocks["hosts"] = hosts
    clocks["log_to_trace"] = log_report
    clocks["thresholds"] = {"min_offset_ns": ClockConfig().min_offset_ns,
                            "max_mad_fraction": ClockConfig().max_mad_fraction}
    return clocks, offsets


def _aggregate_instances(df: pd.DataFrame, dims: dict[str, str]) -> pd.DataFrame:
    """One row per instance (first/last arrival, skew, delay, transfer); marks `df`'s last arrivals."""
    g = df.groupby("key")
    df["last"] = g["arrival"].transform("max")
    df["wait"] = df["last"] - df["arrival"]
    inst = g.agg(pg_name=("pg_name", "first"), seq=("seq", "first"), op=("op", "first"),
                 step=("step", "min"), n=("rank", "size"), first=("arrival", "min"),
                 last=("arrival", "max"), first_end=("end", "min"), last_end=("end", "max"),
                 group_size=("group_size", "max"), seq_basis=("seq_basis", "first")).reset_index()
    # who arrived first / last, and by how much the last one trailed the second-to-last
    srt = df.sort_values(["key", "arrival", "rank"], kind="stable")
    last_rows = srt.groupby("key").tail(1).set_index("key")
    first_rows = srt.groupby("key").head(1).set_index("key")
    second_last = srt.groupby("key")["arrival"].apply(lambda a: a.iloc[-2] if len(a) >= 2 else a.iloc[-1])
    inst["last_rank"] = inst["key"].map(last_rows["rank"]).astype("int64")
    inst["first_rank"] = inst["key"].map(first_rows["rank"]).astype("int64")
    inst["second_last"] = inst["key"].map(second_last).astype("int64")
    inst["skew"] = inst["last"] - inst["first"]
    inst["extra_gap"] = inst["key"].map(_extra_gap(df, srt))
    inst = inst.sort_values(["pg_name", "seq"], kind="stable").reset_index(drop=True)
    inst["delay"] = _late_delay(inst)
    inst["transfer"] = (inst["first_end"].astype("Int64") - inst["last"]).clip(lower=0)
    inst["dim"] = inst["pg_name"].map(lambda p: dims.get(p, "unknown"))
    df["is_last"] = df["rank"].to_numpy() == df["key"].map(last_rows["rank"]).to_numpy()
    return inst


def _extra_gap(df: pd.DataFrame, srt: pd.DataFrame) -> pd.Series:
    """Per instance key: how much longer the last rank took from the end of its own previous collective
    in the group to this arrival than the second-to-last rank took from its own (NA when either has no
    previous end). On gloo the last arriver's collective also ends last, so it arrives last at the next
    one too; its gap, not its arrival, says whether it was slow again."""
    by_seq = df.sort_values(["rank", "pg_name", "seq"], kind="stable")
    gap = (by_seq["arrival"] - by_seq.groupby(["rank", "pg_name"])["end"].shift(1)).astype("Int64")
    gaps = srt["key"].to_frame().assign(gap=gap.reindex(srt.index))
    g = gaps.groupby("key")["gap"]
    return (g.nth(-1).set_axis(gaps.groupby("key").tail(1)["key"]) -
            g.nth(-2).set_axis(gaps.groupby("key").nth(-2)["key"])).astype("Int64")


def _late_delay(inst: pd.DataFrame) -> pd.Series:
    """The late rank's delay: how long the group waited for it beyond everyone else, counting only from
    when the group's previous collective ended (async calls queue behind it anyway), and no more than
    its extra gap since its own previous collective (`_extra_gap`) where both ranks' ends are known."""
    prev_end = inst.groupby("pg_name")["last_end"].shift(1).astype("Int64")
    second = inst["second_last"].astype("Int64")
    ready = prev_end.where(prev_end.notna() & (prev_end > second), second)
    delay = inst["last"].astype("Int64") - ready
    extra = inst["extra_gap"].astype("Int64")
    delay = delay.where(extra.isna() | (delay <= extra), extra)
    return delay.clip(lower=0).astype("int64")


def _summarise(section: dict[str, Any], df: pd.DataFrame, inst: pd.DataFrame, dims: dict[str, str]) -> None:
    """The section's counts, per-group and per-rank statistics and largest skews."""
    complete = inst["group_size"].isna() | (inst["n"] >= inst["group_size"].fillna(0))
    section.update({
        "seq_basis": {str(k): int(v) for k, v in inst["seq_basis"].value_counts().items()},
        "instances": int(len(inst)), "matched": int(len(inst)), "complete": int(complete.sum()),
    })
    by_group = []
    for (pg, op), grp in inst.groupby(["pg_name", "op"]):
        by_group.append({"pg_name": pg, "dim": dims.get(pg, "unknown"), "op": op, "instances": int(len(grp)),
                         "skew_ns": _stats(grp["skew"]), "transfer_ns": _stats(grp["transfer"])})
    section["by_group"] = by_group
    per = []
    for r, grp in df.groupby("rank"):
        lasts = inst[inst["last_rank"] == r]
        per.append({"rank": int(r), "instances": int(len(grp)), "last_count": int(len(lasts)),
                    "delay_ns": int(lasts["delay"].sum()), "wait_ns": int(grp["wait"].sum())})
    section["per_rank"] = per
    top = inst.sort_values("skew", ascending=False).head(20)
    section["top_skew"] = [{
        "pg_name": row.pg_name, "dim": row.dim, "seq": int(row.seq), "op": row.op,
        "step": None if pd.isna(row.step) else int(row.step), "skew_ns": int(row.skew),
        "transfer_ns": int(row.transfer) if not pd.isna(row.transfer) else None,
        "first_rank": int(row.first_rank), "last_rank": int(row.last_rank), "delay_ns": int(row.delay),
    } for row in top.itertuples()]


def match_collectives(store: RunStore, dims: dict[str, str]
                      ) -> tuple[MatchedCollectives | None, dict[str, Any], dict[str, Any]]:
    """(matched instances or None, the clock estimate, the `matching` section)."""
    df = load_collectives(store)
    on_gpu = gpu_ranks(store)
    per_rank, method = choose_sources(df, on_gpu)
    section: dict[str, Any] = {"source": {"method": method, "per_rank": {str(k): v for k, v in per_rank.items()}}}
    if not per_rank:
        return None, dict(NO_CLOCKS), _empty_section(section)
    shifts, log_report = _trace_shifts(store, per_rank)
    df, p2p_df = _select_rows(fill_log_ends(df, shifts), per_rank, on_gpu, section)
    clocks, offsets = _estimate_clocks(store, df, log_report)
    off = df["rank"].map(lambda r: offsets.get(r, 0)).astype("int64")
    df["arrival_raw"] = df["arrival"].astype("int64")
    df["arrival"] = (df["arrival"] - off).astype("int64")
    df["end"] = (df["end"] - off).astype("Int64")
    p2p_rows, section["p2p"], pairs = _pair_p2p(p2p_df, offsets, on_gpu)
    inst = _aggregate_instances(df, dims)
    _summarise(section, df, inst, dims)
    section["warnings"] = integrity_warnings(section)
    rows = df[["key", "pg_name", "seq", "op", "rank", "arrival", "arrival_raw", "end", "wait", "is_last",
               "source", "step", "caller", "bytes"]].reset_index(drop=True)
    # times stay exact nullable int64 (Int64: pd.NA when unknown); counts leave as float64 with NaN
    for frame, cols in ((rows, ("end",)), (inst, ("first_end", "last_end", "transfer"))):
        for c in cols:
            frame[c] = frame[c].astype("Int64")
    for frame, cols in ((rows, ("step", "bytes")), (inst, ("step", "group_size"))):
        for c in cols:
            frame[c] = frame[c].astype("float64")
    waits_in = pd.concat([rows[["rank", "source", "arrival_raw", "wait"]], p2p_rows], ignore_index=True)
    matched = MatchedCollectives(rows=rows, instances=inst, trace_shift=shifts,
                                 wait_intervals=_wait_intervals(waits_in, shifts), gpu_ranks=on_gpu,
                                 p2p_pairs=pairs)
    return matched, clocks, section


def integrity_warnings(section: dict[str, Any]) -> list[str]:
    """What matching left out, in words for the user (analysis.json inputs.warnings, console, report)."""
    out = []
    if section.get("op_mismatches"):
        out.append(f"{section['op_mismatches']} collective instance(s) whose ranks disagree on the op were left "
                   "out of cross-rank matching")
    if section.get("no_group"):
        out.append(f"{section['no_group']} collective call(s) recorded without a process group were left out of "
                   "cross-rank matching (never paired by order under a guessed group)")
    if section.get("no_device_time"):
        out.append(f"{section['no_device_time']} collective call(s) on GPU ranks have no device time (no kernel): "
                   "no arrival, left out of cross-rank matching")
    return out


def _pair_p2p(p2p: pd.DataFrame, offsets: dict[int, int], on_gpu: set[int]
              ) -> tuple[pd.DataFrame, dict[str, int], pd.DataFrame | None]:
    """Pair sends with receives (k-th send src->dst on a group <-> k-th recv at dst from src) and give
    each side its wait for the other: rows (rank, source, arrival_raw, wait), counts, and the pairs'
    transfers (`MatchedCollectives.p2p_pairs`; None without pairs)."""
    empty = pd.DataFrame({"rank": pd.Series(dtype="int64"), "source": pd.Series(dtype="object"),
                          "arrival_raw": pd.Series(dtype="int64"), "wait": pd.Series(dtype="int64")})
    op = p2p["op"].fillna("").astype(str)
    is_send, is_recv = op.str.contains("send"), op.str.contains("recv")
    arrival = p2p["arrival"]
    ok = p2p["peer"].notna() & arrival.notna() & (is_send ^ is_recv)
    p = pd.DataFrame({"rank": p2p["rank"].astype("int64"), "peer": p2p["peer"].astype("float64"),
                      "pg_name": p2p["pg_name"].fillna("?").astype(str), "source": p2p["source"],
                      "send": is_send, "arrival_raw": arrival.astype("float64"),
                      "dur": p2p["dur"].fillna(-1).astype("int64"), "bytes": p2p["bytes"].astype("float64"),
                      "step": p2p["step"].astype("float64"), "gpu": p2p["rank"].isin(on_gpu)})[ok]
    if p.empty:
        return empty, {"pairs": 0, "unpaired": int(len(p2p)), "wait_ns": 0}, None
    p["peer"] = p["peer"].astype("int64")
    p["arrival_raw"] = p["arrival_raw"].astype("int64")
    p["arrival"] = p["arrival_raw"] - p["rank"].map(lambda r: offsets.get(r, 0)).astype("int64")
    p["src"] = np.where(p["send"], p["rank"], p["peer"])
    p["dst"] = np.where(p["send"], p["peer"], p["rank"])
    p = p.sort_values(["src", "dst", "pg_name", "send", "arrival"], kind="stable")
    p["k"] = p.groupby(["src", "dst", "pg_name", "send"]).cumcount()
    keys = ["src", "dst", "pg_name", "k"]
    pairs = p[p["send"]].merge(p[~p["send"]], on=keys, suffixes=("_s", "_r"))
    last = np.maximum(pairs["arrival_s"].to_numpy(), pairs["arrival_r"].to_numpy())
    out = pd.concat([
        pd.DataFrame({"rank": pairs["rank_s"], "source": pairs["source_s"], "arrival_raw": pairs["arrival_raw_s"],
                      "wait": last - pairs["arrival_s"].to_numpy()}),
        pd.DataFrame({"rank": pairs["rank_r"], "source": pairs["source_r"], "arrival_raw": pairs["arrival_raw_r"],
                      "wait": last - pairs["arrival_r"].to_numpy()})], ignore_index=True)
    out["wait"] = out["wait"].astype("int64")
    return out, {"pairs": int(len(pairs)), "unpaired": int(len(p2p) - 2 * len(pairs)),
                 "wait_ns": int(out["wait"].sum())}, _pair_transfers(pairs, last)


def _pair_transfers(pairs: pd.DataFrame, last: np.ndarray) -> pd.DataFrame:
    """Per send/recv pair: its transfer (first side's end − last side's arrival, clipped at 0; 0 when
    either side's duration is unknown), message size, step and whether both sides are device-timed."""
    dur_s, dur_r = pairs["dur_s"].to_numpy(np.int64), pairs["dur_r"].to_numpy(np.int64)
    first_end = np.minimum(pairs["arrival_s"].to_numpy(np.int64) + dur_s, pairs["arrival_r"].to_numpy(np.int64) + dur_r)
    transfer = np.where((dur_s < 0) | (dur_r < 0), 0, np.clip(first_end - last, 0, None))
    return pd.DataFrame({"pg_name": pairs["pg_name"], "src": pairs["src"], "dst": pairs["dst"],
                         "bytes": np.fmax(pairs["bytes_s"].to_numpy(), pairs["bytes_r"].to_numpy()),
                         "step": pairs["step_s"].where(pairs["step_s"].notna(), pairs["step_r"]),
                         "device_timed": (pairs["gpu_s"] & pairs["gpu_r"]).to_numpy(),
                         "transfer": transfer.astype(np.int64)})


def row_trace_shift(rows: pd.DataFrame, shifts: dict[int, int | None]) -> np.ndarray:
    """Per row: what to add to its raw times to reach its rank's trace clock (NaN: unknown).
    Kineto rows are on the trace clock already; log rows need their rank's shift."""
    per_rank = rows["rank"].map(lambda r: shifts.get(r)).astype("float64").to_numpy()
    return np.where(rows["source"].to_numpy() == "kineto", 0.0, per_rank)


def _wait_intervals(rows: pd.DataFrame, shifts: dict[int, int | None]) -> dict[int, iv.IntervalSet]:
    """Per rank, on its trace clock: the time between its arrival and the last member's arrival."""
    out: dict[int, iv.IntervalSet] = {}
    rank = rows["rank"].to_numpy(dtype=np.int64)
    shift = row_trace_shift(rows, shifts)
    ok = ~np.isnan(shift)
    start = rows["arrival_raw"].to_numpy(dtype=np.int64) + np.nan_to_num(shift).astype(np.int64)
    wait = rows["wait"].to_numpy(dtype=np.int64)
    order = np.argsort(rank, kind="stable")
    bounds = np.flatnonzero(np.diff(rank[order])) + 1
    for idx in np.split(order, bounds):
        idx = idx[ok[idx]]
        if idx.size == 0:
            continue
        out[int(rank[idx[0]])] = iv.union(start[idx], start[idx] + wait[idx])
    return out


@dataclass(frozen=True)
class MatchingResult(AnalyzerResult):
    matched: MatchedCollectives | None = None
    """None when no rank has collectives."""
    clocks: dict[str, Any] = field(default_factory=lambda: dict(NO_CLOCKS))
    """The clock estimate (offsets per rank, log-to-trace shifts, hosts): the `clocks` section."""


def matched_of(matching: MatchingResult | None) -> MatchedCollectives | None:
    return matching.matched if matching is not None else None


def analyze_matching(store: RunStore, layout: LayoutResult | None) -> MatchingResult:
    matched, clocks, section = match_collectives(store, dims_of(layout))
    return MatchingResult(findings=[], section=section, matched=matched, clocks=clocks)
