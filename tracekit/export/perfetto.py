"""The whole analysed run as one Chrome trace-event JSON document, for ui.perfetto.dev and chrome://tracing.

    export_perfetto(store, analysis, "run.perfetto.json", matched=...)

Layout (Chrome trace event format, JSON object form):
- one process per rank (`pid` = rank + 1, named "rank R"; process_sort_index = rank), and one process
  "run" (`pid` 0 is avoided: Perfetto reserves it) for what belongs to no single rank;
- per rank, one thread per host thread (events table, lanes host and comm_thread: named by the
  profiler's thread name) and one per device stream ("stream N"), holding every event of the events
  table as a complete event (`ph: X`; an event without a valid duration as an instant `ph: i`). Slices
  that overlap without nesting (which the trace-event format cannot show on one thread) go to an extra
  thread "<name> (overlap k)" instead of being dropped;
- per rank, "collectives <group>" threads: each matched collective member (derive/matching.py's rows)
  from its arrival to its end; in the run process one "instances <group>" thread with each collective
  instance from its first arrival to its last end, and one flow arrow (`ph: s` → `ph: f`, cat
  "collective" like both slices, at their start: DevTools binds a flow event to the slice of equal cat,
  pid, tid and ts, Perfetto to the enclosing slice) from the instance to each of its members;
- per rank, a "critical path" thread: the critical path of every replayed step (section critical_path,
  merged runs of one lane), linked in order by flow arrows (cat "critical_path"); rows on no rank (the
  sync nodes) in the run process;
- per rank, a "findings" thread: each finding naming the rank (every rank when it names none) as
  slices over the time it covers on that rank: a straggler, each stretch a group waited for it (the
  second-to-last member's arrival to its own, where it arrived last); a finding about an op
  (unoverlapped_collective: evidence `op`, the finding's dim), the rank's members of that op on that dim;
  both inside the rank's step windows. Any other finding (or one whose collectives are not matched)
  covers the rank's step windows (the device window on GPU ranks: first kernel start to last kernel
  end; the ProfilerStep on CPU ranks), only the steps its evidence names when it names some
  (`step`/`steps`), the rank's whole trace when it has no step.

Clock: every rank's times are moved onto rank 0's clock by subtracting the offset the clocks analysis
applied (section clocks, `applied`), the same offsets matching used; times are then written relative
to the run's origin (the earliest aligned event) in microseconds with the nanoseconds as decimals
(exact: relative values stay far below 2^53 ns). `otherData.tracekit` states the origin (ns, rank-0
clock), the applied offsets and their estimated error (the clock estimate's median absolute deviation;
0 for manifest anchors), so a reader can map every timestamp back to its rank's own clock exactly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tracekit.process_env import gc_paused

if TYPE_CHECKING:
    from tracekit.derive.matching import MatchedCollectives
    from tracekit.tables.store import RunStore

RUN_PID = 1_000_000_000
"""pid of the run's own process (instances, sync nodes of the critical path): above any rank's pid."""
EVENT_COLUMNS = ["name", "cat", "ts", "dur", "pid", "tid", "thread_name", "stream", "lane", "correlation",
                 "external_id", "step"]
# thread sort order within a rank's process
ORDER_FINDINGS, ORDER_PATH, ORDER_COLLECTIVES, ORDER_HOST, ORDER_COMM_THREAD, ORDER_DEVICE = 0, 1, 2, 3, 4, 5


@dataclass
class PerfettoExport:
    """What `export_perfetto` wrote."""

    path: Path
    ranks: list[int]
    events: int
    """events-table rows written (complete events and instants)"""
    instances: int
    flows: int
    """collective flows written: one per placed member"""
    unplaced_members: int
    """members whose rank's log could not be put on its trace clock (no flow)"""
    path_slices: int
    finding_slices: int
    origin_ns: int
    offsets_ns: dict[int, int] = field(default_factory=dict)


def applied_offsets(analysis: dict[str, Any]) -> dict[int, int]:
    """{rank: offset to subtract} the clocks analysis applied (section clocks)."""
    clocks = (analysis.get("sections") or {}).get("clocks") or {}
    return {int(r["rank"]): int(r["offset_ns"]) for r in clocks.get("ranks", [])
            if r.get("applied") and r.get("offset_ns") is not None}


def offset_errors(analysis: dict[str, Any]) -> dict[int, int | None]:
    """{rank: estimated error of its clock offset in ns}: the estimate's median absolute deviation, 0 for
    anchors, None when the offset was not estimated (then nothing was applied)."""
    clocks = (analysis.get("sections") or {}).get("clocks") or {}
    return {int(r["rank"]): (None if r.get("mad_ns") is None else int(r["mad_ns"])) for r in clocks.get("ranks", [])}


class _Tracks:
    """Threads (tid per pid) with names and sort order, and the nesting layers of each."""

    def __init__(self) -> None:
        self._tid: dict[tuple, int] = {}
        self._next: dict[int, int] = {}
        self.meta: list[dict[str, Any]] = []
        self._layers: dict[tuple, list[list[int]]] = {}

    def tid(self, pid: int, key: tuple, name: str, order: int) -> int:
        k = (pid, key)
        if k not in self._tid:
            t = self._next.get(pid, 0) + 1
            self._next[pid] = t
            self._tid[k] = t
            self.meta.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": t, "args": {"name": name}})
            self.meta.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": t,
                              "args": {"sort_index": order * 100_000 + t}})
        return self._tid[k]

    def place(self, pid: int, key: tuple, name: str, order: int, start: int, end: int) -> int:
        """tid of the first layer of track `key` where [start, end) nests (slices must arrive sorted by
        start, longer first at equal starts)."""
        layers = self._layers.setdefault((pid, key), [])
        for i, stack in enumerate(layers):
            while stack and stack[-1] <= start:
                stack.pop()
            if not stack or end <= stack[-1]:
                stack.append(end)
                return self.tid(pid, key + (i,), name if i == 0 else f"{name} (overlap {i})", order)
        layers.append([end])
        i = len(layers) - 1
        return self.tid(pid, key + (i,), name if i == 0 else f"{name} (overlap {i})", order)


def _slice(name: str, cat: str, track: tuple[int, tuple, str, int], start: int, end: int,
           args: dict[str, Any] | None = None) -> dict[str, Any]:
    """A complete event on `track` = (pid, key, thread name, order); its tid is set by `_place_all`."""
    ev = {"ph": "X", "name": name, "cat": cat, "pid": track[0], "tid": 0, "ts": start, "dur": max(end - start, 0),
          "_track": track}
    if args:
        ev["args"] = args
    return ev


def _flow(ph: str, fid: int, cat: str, name: str, at: dict[str, Any], ts: int) -> dict[str, Any]:
    """Flow start (`s`) or end (`f`, bound to the enclosing slice) on the thread of slice `at`."""
    ev = {"ph": ph, "id": fid, "cat": cat, "name": name, "pid": at["pid"], "tid": 0, "ts": ts, "_at": at}
    if ph == "f":
        ev["bp"] = "e"
    return ev


def _place_all(tracks: _Tracks, events: list[dict[str, Any]]) -> None:
    """Give each pending slice a tid (nesting layers, slices in start order, longer first) and each flow
    its slice's tid."""
    pending = sorted((ev for ev in events if "_track" in ev), key=lambda ev: (ev["ts"], -ev["dur"]))
    for ev in pending:
        pid, key, name, order = ev.pop("_track")
        ev["tid"] = tracks.place(pid, key, name, order, ev["ts"], ev["ts"] + ev["dur"])
    for ev in events:
        at = ev.pop("_at", None)
        if at is not None:
            ev["tid"] = at["tid"]


def _track_names(is_dev: np.ndarray, pid: np.ndarray, key: np.ndarray, lane_comm: np.ndarray,
                 thread_name: list[str | None], first: np.ndarray) -> list[tuple[tuple, str, int]]:
    """(track key, thread name, order) of each distinct track, from its first row `first`."""
    out = []
    for i in first.tolist():
        if is_dev[i]:
            out.append((("stream", int(pid[i]), int(key[i])), f"stream {int(key[i])}", ORDER_DEVICE))
        else:
            out.append((("thread", int(pid[i]), int(key[i])), thread_name[i] or f"thread {int(key[i])}",
                        ORDER_COMM_THREAD if lane_comm[i] else ORDER_HOST))
    return out


def _layers(track: np.ndarray, ts: np.ndarray, end: np.ndarray, slices: np.ndarray) -> np.ndarray:
    """Nesting layer of each row: rows sorted by track, start, longer first; a slice that would overlap
    its thread's open slice without nesting goes to the first layer where it nests (instants: layer 0)."""
    order = np.lexsort((-(end - ts), ts, track))
    layer = np.zeros(ts.size, np.int64)
    stacks: list[list[int]] = []
    prev = None
    for i, tr, s, e, sl in zip(order.tolist(), track[order].tolist(), ts[order].tolist(), end[order].tolist(),
                               slices[order].tolist()):
        if tr != prev:
            stacks, prev = [], tr
        if not sl:
            continue
        for k, stack in enumerate(stacks):
            while stack and stack[-1] <= s:
                stack.pop()
            if not stack or e <= stack[-1]:
                stack.append(e)
                layer[i] = k
                break
        else:
            stacks.append([e])
            layer[i] = len(stacks) - 1
    return layer


def _column(t: pa.Table, name: str, fill: int) -> np.ndarray:
    return t.column(name).fill_null(fill).to_numpy().astype(np.int64, copy=False)


def _rank_tracks(t: pa.Table, pid: int, ts: np.ndarray, dur: np.ndarray, has_dur: np.ndarray,
                 tracks: _Tracks) -> list[int]:
    """The tid of each events row: its host thread or device stream, in the nesting layer it fits."""
    lane = t.column("lane").cast(pa.string())
    is_dev = pc.equal(lane, "device").fill_null(False).to_numpy(zero_copy_only=False)
    comm = pc.equal(lane, "comm_thread").fill_null(False).to_numpy(zero_copy_only=False)
    raw_pid = _column(t, "pid", 0)
    key = np.where(is_dev, _column(t, "stream", -1), _column(t, "tid", 0))
    _, first, track = np.unique(np.stack([is_dev.astype(np.int64), raw_pid, key], axis=1), axis=0,
                                return_index=True, return_inverse=True)
    track = track.reshape(-1)
    names = _track_names(is_dev, raw_pid, key, comm, t.column("thread_name").cast(pa.string()).to_pylist(), first)
    layer = _layers(track, ts, ts + dur, has_dur)
    tid_of: dict[tuple[int, int], int] = {}
    for tr, ly in sorted(set(zip(track.tolist(), layer.tolist()))):
        k, name, order = names[tr]
        tid_of[(tr, ly)] = tracks.tid(pid, k + (ly,), name if ly == 0 else f"{name} (overlap {ly})", order)
    return [tid_of[k] for k in zip(track.tolist(), layer.tolist())]


def rank_events(store: RunStore, rank: int, offset: int, origin: int, tracks: _Tracks) -> list[dict[str, Any]]:
    """Every events-table row of `rank` as a trace event on the aligned clock, µs after `origin` (exact:
    float µs of a relative ns value below 2^53 / 1000 round-trip to the same ns)."""
    t = store.rank_table("events", rank, EVENT_COLUMNS)
    if t.num_rows == 0:
        return []
    pid = rank + 1
    ts = t.column("ts").to_numpy() - offset
    has_dur = t.column("dur").is_valid().to_numpy(zero_copy_only=False)
    dur = _column(t, "dur", 0)
    tids = _rank_tracks(t, pid, ts, dur, has_dur, tracks)
    rel, durs, slices = ((ts - origin) / 1000).tolist(), (dur / 1000).tolist(), has_dur.tolist()
    cols = [t.column(c).cast(pa.string()).to_pylist() if c in ("name", "cat") else t.column(c).to_pylist()
            for c in ("name", "cat", "correlation", "external_id", "step")]
    out: list[dict[str, Any]] = []
    with gc_paused():  # many small dicts: the cyclic collector would rescan them again and again (DESIGN §9)
        _build_events(out, cols, slices, pid, tids, rel, durs)
    return out


def _build_events(out: list[dict[str, Any]], cols: list[list[Any]], slices: list[bool], pid: int, tids: list[int],
                  rel: list[float], durs: list[float]) -> None:
    for i, (nm, cat, corr, ext, st) in enumerate(zip(*cols)):
        if slices[i]:
            ev = {"ph": "X", "name": nm or "", "cat": cat or "", "pid": pid, "tid": tids[i], "ts": rel[i], "dur": durs[i]}
        else:
            ev = {"ph": "i", "s": "t", "name": nm or "", "cat": cat or "", "pid": pid, "tid": tids[i], "ts": rel[i]}
        if corr is not None or ext is not None or st is not None:
            ev["args"] = {k: v for k, v in (("correlation", corr), ("external_id", ext), ("step", st)) if v is not None}
        out.append(ev)


def _int(v: Any) -> int | None:
    try:
        if v is None or v != v:  # NaN / NA
            return None
        return int(v)
    except (TypeError, ValueError):
        return None


def placed_instances(matched: MatchedCollectives | None, ranks: set[int]
                     ) -> tuple[list[tuple[str, list[dict[str, Any]]]], int]:
    """([(instance key, members)] in order of first arrival, members not placed): each member's rank, op,
    group, dim and [start, end) on the aligned clock (matching's arrival and end plus the rank's log-to-trace
    shift; a member whose shift is unknown is not placed)."""
    if matched is None or matched.n_rows == 0:
        return [], 0
    inst = matched.instances
    dims = dict(zip(inst["key"].tolist(), inst["dim"].tolist()))
    rows = matched.rows
    shift = matched.trace_shift
    members: dict[str, list[dict[str, Any]]] = {}
    unplaced = 0
    for r in rows.itertuples(index=False):
        rank = int(r.rank)
        s = shift.get(rank, 0)
        if rank not in ranks or s is None:
            unplaced += 1
            continue
        start = int(r.arrival) + s
        end = _int(r.end)
        members.setdefault(r.key, []).append({"rank": rank, "start": start, "end": start if end is None else end + s,
                                              "op": r.op, "pg": r.pg_name, "seq": int(r.seq), "source": r.source,
                                              "bytes": _int(r.bytes), "dim": dims.get(r.key)})
    return sorted(members.items(), key=lambda kv: (min(m["start"] for m in kv[1]), kv[0])), unplaced


def collective_events(insts: list[tuple[str, list[dict[str, Any]]]], tracks: _Tracks
                      ) -> tuple[list[dict[str, Any]], int]:
    """Member slices, instance slices and one flow per member; (events, flows)."""
    out: list[dict[str, Any]] = []
    flows = 0
    for key, mem in insts:
        first, last_end = min(m["start"] for m in mem), max(m["end"] for m in mem)
        m0 = mem[0]
        label = f"{m0['op']} {m0['pg']}#{m0['seq']}"
        # cat "collective" as its flows': DevTools binds a flow event to the slice of equal cat, pid, tid and ts
        inst = _slice(label, "collective",
                      (RUN_PID, ("instances", m0["pg"]), f"instances {m0['pg']}", ORDER_COLLECTIVES), first, last_end,
                      {"key": key, "members": sorted(m["rank"] for m in mem),
                       "skew_ns": max(m["start"] for m in mem) - first})
        out.append(inst)
        for m in mem:
            track = (m["rank"] + 1, ("collectives", m["pg"]), f"collectives {m['pg']}", ORDER_COLLECTIVES)
            member = _slice(label, "collective", track, m["start"], m["end"],
                            {"key": key, "rank": m["rank"], "source": m["source"], "bytes": m["bytes"]})
            flows += 1
            out += [member, _flow("s", flows, "collective", key, inst, first),
                    _flow("f", flows, "collective", key, member, m["start"])]
    _place_all(tracks, out)
    return out, flows


def path_events(analysis: dict[str, Any], ranks: set[int], tracks: _Tracks, first_flow_id: int
                ) -> tuple[list[dict[str, Any]], int]:
    """The critical path of every replayed step (replay clock = the aligned clock) and its chain of flows."""
    cp = (analysis.get("sections") or {}).get("critical_path") or {}
    out: list[dict[str, Any]] = []
    n = 0
    fid = first_flow_id
    for step in cp.get("steps") or []:
        prev = None
        for row in step.get("path") or []:
            r = row.get("rank")
            pid = r + 1 if r is not None and r in ranks else RUN_PID
            start, end = int(row["start_ns"]), int(row["end_ns"])
            sl = _slice(f"{row['category']}: {row.get('name') or ''}", "critical_path",
                        (pid, ("critical_path",), "critical path", ORDER_PATH), start, end,
                        {"step": step.get("step"), "lane": row.get("lane"), "category": row["category"],
                         "ops": row.get("ops"), "dim": row.get("dim")})
            out.append(sl)
            n += 1
            if prev is not None:
                fid += 1
                out += [_flow("s", fid, "critical_path", f"step {step.get('step')}", prev, prev["ts"]),
                        _flow("f", fid, "critical_path", f"step {step.get('step')}", sl, start)]
            prev = sl
    _place_all(tracks, out)
    return out, n


def step_windows(store: RunStore, offsets: dict[int, int]) -> dict[int, list[tuple[int, int, int]]]:
    """{rank: [(step, start, end)]} on the aligned clock: the device window where the step has kernels,
    else the ProfilerStep interval."""
    out: dict[int, list[tuple[int, int, int]]] = {}
    for r in store.table("steps", ["rank", "step", "ts", "dur", "device_ts", "device_dur"]).to_pylist():
        off = offsets.get(r["rank"], 0)
        if r["device_ts"] is not None and r["device_dur"] is not None:
            s, d = r["device_ts"], r["device_dur"]
        else:
            s, d = r["ts"], r["dur"] or 0
        out.setdefault(r["rank"], []).append((r["step"], s - off, s - off + d))
    return out


def _finding_steps(evidence: dict[str, Any]) -> set[int] | None:
    steps = evidence.get("steps") if isinstance(evidence.get("steps"), list) else None
    if steps is None and isinstance(evidence.get("step"), int):
        steps = [evidence["step"]]
    ok = {s for s in (steps or []) if isinstance(s, int)}
    return ok or None


def _in_steps(start: int, windows: list[tuple[int, int, int]]) -> bool:
    return not windows or any(s <= start < e for _, s, e in windows)


def collective_ranges(f: dict[str, Any], rank: int, insts: list[tuple[str, list[dict[str, Any]]]],
                      windows: list[tuple[int, int, int]]) -> list[tuple[int, int]]:
    """The collective time a finding is about on `rank` (in its step windows): a straggler's, the
    stretch each group waited for it (second-to-last arrival to its own, where it arrived last); a
    finding naming an op (unoverlapped_collective), the rank's members of that op on the finding's dim."""
    ev = f.get("evidence") or {}
    out = []
    for _, mem in insts:
        mine = next((m for m in mem if m["rank"] == rank), None)
        if mine is None or not _in_steps(mine["start"], windows):
            continue
        if f.get("kind") == "straggler":
            arrivals = sorted(m["start"] for m in mem)
            if len(mem) > 1 and mine["start"] == arrivals[-1] and arrivals[-2] < arrivals[-1]:
                out.append((arrivals[-2], arrivals[-1]))
        elif ev.get("op") and mine["op"] == ev["op"] and (f.get("dim") is None or mine["dim"] == f.get("dim")):
            out.append((mine["start"], mine["end"]))
    return out


def finding_events(analysis: dict[str, Any], windows: dict[int, list[tuple[int, int, int]]],
                   spans: dict[int, tuple[int, int]], insts: list[tuple[str, list[dict[str, Any]]]],
                   tracks: _Tracks) -> list[dict[str, Any]]:
    """Each finding on each rank it names, over the time it covers (module docstring)."""
    out: list[dict[str, Any]] = []
    for f in analysis.get("findings") or []:
        named = [r for r in (f.get("ranks") or []) if r in spans] or sorted(spans)
        only = _finding_steps(f.get("evidence") or {})
        args = {"summary": f.get("summary"), "recommendation": f.get("recommendation"),
                "est_saving_ns": f.get("est_saving_ns"), "dim": f.get("dim"), "ranks": f.get("ranks")}
        for r in named:
            steps = [w for w in windows.get(r, []) if only is None or w[0] in only]
            ranges = collective_ranges(f, r, insts, steps) or [(s, e) for _, s, e in steps] or [spans[r]]
            for s, e in ranges:
                out.append(_slice(f"{f['severity']}: {f['kind']}", "finding",
                                  (r + 1, ("findings",), "findings", ORDER_FINDINGS), s, e, args))
    _place_all(tracks, out)
    return out


def _rank_spans(store: RunStore, offsets: dict[int, int]) -> dict[int, tuple[int, int]]:
    out = {}
    for r in store.table("ranks", ["rank", "first_ts", "last_ts"]).to_pylist():
        if r["first_ts"] is not None and r["last_ts"] is not None:
            off = offsets.get(r["rank"], 0)
            out[r["rank"]] = (r["first_ts"] - off, r["last_ts"] - off)
    return out


def _relative(events: Iterable[dict[str, Any]], origin: int) -> None:
    """Absolute ns → µs after `origin` (float: exact to the ns for spans below ~100 days)."""
    for ev in events:
        if "ts" in ev:
            ev["ts"] = (ev["ts"] - origin) / 1000
        if "dur" in ev:
            ev["dur"] = ev["dur"] / 1000


def _process_meta(ranks: list[int], store: RunStore) -> list[dict[str, Any]]:
    hosts = {r["rank"]: r["hostname"] for r in store.table("ranks", ["rank", "hostname"]).to_pylist()}
    out = []
    for r in ranks:
        name = f"rank {r}" + (f" ({hosts[r]})" if hosts.get(r) else "")
        out.append({"ph": "M", "name": "process_name", "pid": r + 1, "args": {"name": name}})
        out.append({"ph": "M", "name": "process_sort_index", "pid": r + 1, "args": {"sort_index": r}})
        out.append({"ph": "M", "name": "process_labels", "pid": r + 1, "args": {"labels": f"rank={r}"}})
    out.append({"ph": "M", "name": "process_name", "pid": RUN_PID, "args": {"name": "run (all ranks)"}})
    out.append({"ph": "M", "name": "process_sort_index", "pid": RUN_PID, "args": {"sort_index": -1}})
    return out


def export_perfetto(store: RunStore, analysis: dict[str, Any], path: str | Path,
                    matched: MatchedCollectives | None = None) -> PerfettoExport:
    """Write the run's aligned timeline to `path` (module docstring); `matched`: matching's instances
    (analyze_matching(store, layout).matched), without which no collective is linked. The events are
    written rank by rank: memory holds one rank's events at a time."""
    path = Path(path)
    ranks = store.ranks()
    offsets = applied_offsets(analysis)
    tracks = _Tracks()
    insts, unplaced = placed_instances(matched, set(ranks))
    coll, n_flows = collective_events(insts, tracks)
    n_inst = len(insts)
    cpath, n_path = path_events(analysis, set(ranks), tracks, n_flows)
    spans = _rank_spans(store, offsets)
    finds = finding_events(analysis, step_windows(store, offsets), spans, insts, tracks)
    starts = [s for s, _ in spans.values()] + [ev["ts"] for c in (coll, cpath, finds) for ev in c]
    origin = min(starts) if starts else 0
    for c in (coll, cpath, finds):
        _relative(c, origin)
    n_events = 0
    enc = msgspec.json.Encoder()
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as fh:
        fh.write(b'{"displayTimeUnit":"ns","traceEvents":[')
        first = _write_events(fh, enc, [_process_meta(ranks, store), coll, cpath, finds], True)
        for r in ranks:
            evs = rank_events(store, r, offsets.get(r, 0), origin, tracks)
            n_events += len(evs)
            first = _write_events(fh, enc, [evs], first)
        _write_events(fh, enc, [tracks.meta], first)
        other = {"tracekit": {"origin_ns": origin, "clock": "rank 0's clock: each rank's times minus its applied offset",
                              "clock_offsets_ns": {str(r): offsets.get(r, 0) for r in ranks},
                              "offset_error_ns": {str(k): v for k, v in offset_errors(analysis).items()},
                              "ranks": ranks, "instances": n_inst, "collective_flows": n_flows,
                              "unplaced_members": unplaced, "schema": analysis.get("schema")}}
        fh.write(b'],"otherData":' + enc.encode(other) + b"}\n")
    return PerfettoExport(path=path, ranks=ranks, events=n_events, instances=n_inst, flows=n_flows,
                          unplaced_members=unplaced, path_slices=n_path, finding_slices=len(finds),
                          origin_ns=origin, offsets_ns={r: offsets.get(r, 0) for r in ranks})


def _write_events(fh: Any, enc: msgspec.json.Encoder, chunks: list[list[dict[str, Any]]], first: bool) -> bool:
    """Append the chunks' events to the open traceEvents array; whether the array is still empty."""
    for c in chunks:
        if not c:
            continue
        body = enc.encode(c)[1:-1]
        fh.write(body if first else b"," + body)
        first = False
    return first
