"""A rank's host activity and the gaps between it: what `analyze/host_stalls.py` measures as stalls and the
what-if replay (whatif/build.py, whatif/fixes.py `host_stalls`) removes. Definitions are in host_stalls.py's
docstring.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tracekit.derive import intervals as iv
from tracekit.parse.classify import label_rows
from tracekit.parse.dict_columns import object_strings, text_test
from tracekit.tables.store import RunStore

MIN_GAP_NS = 1_000_000
"""A host gap shorter than this is dispatch overhead between ops, not a stall."""
HOST_CATS = ("cpu_op", "user_annotation", "cuda_runtime", "cuda_driver", "python_function", "operator")


def np_of(col: pa.ChunkedArray, fill: int = 0) -> np.ndarray:
    return col.fill_null(fill).to_numpy()


def str_is(col: pa.ChunkedArray, values: tuple[str, ...]) -> np.ndarray:
    return np_of(text_test(col, pc.is_in, pa.array(values)), False).astype(bool)


@dataclass
class HostEvents:
    """One rank's host events as arrays: activity (ops, runtime and communication calls, tracekit's own
    ranges — not step annotations, data-loading ranges or labels), data loading, the names of the
    data-loading events, and each label's intervals (evidence only)."""

    act: iv.IntervalSet
    loading: iv.IntervalSet
    data_names: list[str]
    labels: dict[str, iv.IntervalSet]


def _host_rows(t: pa.Table) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Masks of a rank's events `t` (name, cat, ts, dur, role, lane): host rows, data loading, labels and
    activity (`HostEvents`); their starts and ends."""
    dur = np_of(t["dur"], -1)
    host = (~str_is(t["lane"], ("device",))) & (dur >= 0) & str_is(t["cat"], HOST_CATS)
    data = host & str_is(t["role"], ("data_load",))
    label = host & label_rows(t["cat"], t["role"])
    ops = host & ~data & ~label & ~str_is(t["role"], ("step_annotation",))
    ts = np_of(t["ts"])
    return host, data, label, ops, ts, ts + dur


def host_events(store: RunStore, rank: int, events: pa.Table | None = None) -> HostEvents:
    t = events if events is not None else store.rank_table("events", rank, ["name", "cat", "ts", "dur", "role", "lane"])
    _, data, label, ops, ts, end = _host_rows(t)
    names = object_strings(t["name"], "")
    at = np.flatnonzero(label)  # each label's rows, grouped once (not one scan of the rank's events per label)
    uniq, inv = np.unique(names[at].astype(str), return_inverse=True) if at.size else (np.array([], str), at)
    order = np.argsort(inv, kind="stable")
    bounds = np.searchsorted(inv[order], np.arange(uniq.size + 1))
    labels = {str(nm): iv.union(ts[at[order[bounds[i]:bounds[i + 1]]]], end[at[order[bounds[i]:bounds[i + 1]]]])
              for i, nm in enumerate(uniq.tolist())}
    return HostEvents(act=iv.union(ts[ops], end[ops]), loading=iv.union(ts[data], end[data]),
                      data_names=sorted(set(names[data].tolist())), labels=labels)


def long_gaps(active: iv.IntervalSet, lo: int, hi: int) -> iv.IntervalSet:
    """Complement of `active` in [lo, hi), keeping only gaps of at least MIN_GAP_NS."""
    starts, ends = iv.complement(active, lo, hi)
    keep = (ends - starts) >= MIN_GAP_NS
    return starts[keep], ends[keep]


def host_idle(store: RunStore, rank: int, events: pa.Table | None = None) -> iv.IntervalSet:
    """The rank's host time a stall fix may remove (trace clock): its host gaps of at least MIN_GAP_NS (no op,
    runtime or communication call running) from its first to its last host event of any kind (a stall before
    a step's first op lies inside the step), and its data loading; empty where no host op was recorded.
    `events`: the rank's whole events table (name, cat, ts, dur, role, lane), where the caller has read it."""
    t = events if events is not None else store.rank_table("events", rank, ["name", "cat", "ts", "dur", "role", "lane"])
    host, data, _, ops, ts, end = _host_rows(t)  # host_events' activity and loading (its labels not needed)
    loading = iv.union(ts[data], end[data])
    act = iv.union(ts[ops], end[ops])
    if not act[0].size:
        return loading
    return iv.merge(long_gaps(act, int(ts[host].min()), int(end[host].max())), loading)
