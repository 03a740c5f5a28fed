"""What each event is, decided once in the parser (DESIGN §3; STYLE 3 "normalise once").

Analyzers read the answers as columns — `events.role`, `events.lane`, `kernels.kind`,
`kernels.step` / `kernels.carry_over`, `steps.device_ts` / `device_dur`, `process_groups.dim` —
instead of matching names. Every spelling of those answers lives in this module:

- role of an event (`ROLES`): the step annotation `ProfilerStep#N` (whatever its category: the
  2021–2023 "Operator" traces and gloo CPU runs record it as a `cpu_op`; it is never compute);
  data loading (PyTorch's own `enumerate(DataLoader)#...` ranges, which PyTorch writes for every job);
  tracekit's own work (`tracekit::...`); communication (c10d / functional collectives,
  `record_param_comms`, `nccl:` / `gloo:` / `rccl:` annotations, our runtime's `comm:` labels, events on
  a backend's worker threads); device rows take their kernel kind; other host ops (`cpu_op`) are
  compute; everything else is other.
- labels (`is_label`): a user's `record_function` range whose name decides no role (any name, e.g.
  `my_fetch`) is role other and is no host activity
  by itself: only the ops inside it are. A sleep or a fetch inside a label is a host gap like one with
  no label; analyzers may name the label as evidence of what the gap was, never find anything by it.
- the step of a kernel: the step of the host runtime call that launched it (same correlation id,
  the step window enclosing the launch's start). A kernel whose launch is not in the trace and that
  starts before the first linked kernel is carry-over from before profiling (no step). When nothing
  in the trace links kernels to launches (no correlation ids), kernels fall back to the step window
  enclosing their own start.
- the parallel dim of a process group, from its description (DeviceMesh names its groups
  `mesh_<axis>`; `default_pg` is the world).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tracekit.parse.collective_names import is_comm_kernel_name
from tracekit.parse.dict_columns import codes, text_test
from tracekit.tables.schema import EVENT_ROLES as ROLES
from tracekit.tables.schema import KERNEL_KINDS, LANES, STEP_PATTERN

STEP_RE = re.compile(STEP_PATTERN)


OVERHEAD_PREFIX = "tracekit::"
DATA_LOAD_PREFIXES = ("enumerate(DataLoader)",)  # written by PyTorch itself for every job
LABEL_CATS = ("user_annotation",)
COMM_PREFIXES = ("c10d::", "c10d_functional", "_c10d_functional",  # ::all_reduce, .all_reduce, _autograd::
                 "record_param_comms", "nccl:", "gloo:", "rccl:", "ProcessGroup", "torch.distributed",
                 "comm:")
COMM_THREAD_RE = re.compile(r"pt_gloo_runloop|pt_nccl|gloo", re.I)
_NO_ROLE = -1


def step_number(name: str | None) -> int | None:
    """N of `ProfilerStep#N`, None for any other name."""
    m = STEP_RE.match(name) if name else None
    return int(m.group(1)) if m else None


def name_role(name: str | None) -> str | None:
    """The role a name alone decides (step annotation, data loading, overhead, communication), else None."""
    if not name:
        return None
    if STEP_RE.match(name):
        return "step_annotation"
    if name.startswith(OVERHEAD_PREFIX):
        return "overhead"
    if name.startswith(DATA_LOAD_PREFIXES):
        return "data_load"
    if name.startswith(COMM_PREFIXES):
        return "comm"
    return None


def is_label(name: str | None, cat: str | None) -> bool:
    """A user's `record_function` range (a user annotation whose name decides no role): a label around
    work, not work — only the ops inside it are host activity."""
    return cat in LABEL_CATS and name_role(name) is None


def label_rows(cat: pa.ChunkedArray | pa.Array, role: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """`is_label` over an events table's columns: user annotations the parser gave no role (other)."""
    def is_in(col, values):  # on a dictionary column's distinct values (`text_test`), not a string per row
        return text_test(col, pc.is_in, pa.array(values)).fill_null(False).to_numpy(
            zero_copy_only=False).astype(bool)
    return is_in(cat, LABEL_CATS) & is_in(role, ["other"])


def is_comm_thread(thread_name: str | None) -> bool:
    """Worker threads of a communication backend (gloo's `pt_gloo_runloop`, NCCL's watchdog/ops threads)."""
    return bool(thread_name) and bool(COMM_THREAD_RE.search(thread_name))


def kernel_kinds(is_comm: np.ndarray, is_memcpy: np.ndarray, is_memset: np.ndarray) -> np.ndarray:
    """Kind code (index into KERNEL_KINDS) of each device row: comm ▸ memcpy ▸ memset ▸ compute."""
    return np.select([is_comm, is_memcpy, is_memset], [1, 2, 3], 0).astype(np.int8)


def kind_column(codes: np.ndarray) -> pa.DictionaryArray:
    """`kernels.kind` from kind codes."""
    return pa.DictionaryArray.from_arrays(pa.array(codes.astype(np.int32), pa.int32()),
                                          pa.array(KERNEL_KINDS, pa.string()))


def event_roles(name_dict: list, name_codes: np.ndarray, is_cpu_op: np.ndarray, lane: np.ndarray,
                device_rows: np.ndarray, device_kind: np.ndarray) -> pa.DictionaryArray:
    """`events.role` of every row.

    name_dict/name_codes: the name dictionary and each row's code; is_cpu_op: rows of category
    `cpu_op`; lane: each row's lane code (index into LANES); device_rows/device_kind: the rows of
    kernels/memcpy/memset and their kind codes (index into KERNEL_KINDS)."""
    by_name = np.array([_role_code(name_role(nm)) for nm in name_dict] + [_NO_ROLE], np.int8)
    role = by_name[name_codes] if len(name_codes) else np.zeros(0, np.int8)
    unset = role == _NO_ROLE
    role[unset & (lane == LANES.index("comm_thread"))] = ROLES.index("comm")
    unset = role == _NO_ROLE
    role[unset & is_cpu_op] = ROLES.index("compute")
    role[role == _NO_ROLE] = ROLES.index("other")
    if len(device_rows):  # a device row is what its kernel kind says (a comm kernel is comm by its args too)
        role[device_rows] = np.array([ROLES.index(k) for k in KERNEL_KINDS], np.int8)[device_kind]
    return pa.DictionaryArray.from_arrays(pa.array(role.astype(np.int32), pa.int32()), pa.array(ROLES, pa.string()))


def _role_code(role: str | None) -> int:
    return _NO_ROLE if role is None else ROLES.index(role)


def lane_codes(thread_labels: list, thread_codes: np.ndarray, gpu_row: np.ndarray) -> np.ndarray:
    """Lane code of every row: device for GPU rows, comm_thread for a backend's worker threads, else host.

    thread_labels/thread_codes: the thread-name dictionary and each row's code (-1 = no name)."""
    per_label = np.array([LANES.index("comm_thread") if is_comm_thread(t) else 0 for t in thread_labels] + [0], np.int8)
    lane = per_label[thread_codes] if len(thread_codes) else np.zeros(0, np.int8)
    lane[gpu_row] = LANES.index("device")
    return lane


def lane_column(lane: np.ndarray) -> pa.DictionaryArray:
    return pa.DictionaryArray.from_arrays(pa.array(lane.astype(np.int32), pa.int32()), pa.array(LANES, pa.string()))


# ----------------------------------------------------------------------------------------------
# steps


STEP_RULES = ("profiler_step", "optimizer_step", "graph_launch", "repeated_ops")
"""How a rank's steps were found (`steps.rule`): its `ProfilerStep#N` annotations; else, on traces with
device work and no ProfilerStep, iterations where the trace repeats (`iteration_windows`)."""
OPTIMIZER_STEP_RE = re.compile(r"^Optimizer\.step#")  # torch.optim writes `Optimizer.step#<Class>.step`
GRAPH_LAUNCH_NAMES = frozenset({"cudaGraphLaunch", "hipGraphLaunch", "cuGraphLaunch", "cudaGraphLaunch_v10000"})
ITERATION_OP_CATS = ("cpu_op", "user_annotation")
MAX_PERIOD_OPS = 5_000
"""Longest iteration (top-level host ops) looked for: bounds the search on long traces."""


class StepWindows:
    """The host step intervals of one rank (`ProfilerStep#N`, or iterations found by `iteration_windows`),
    sorted by start (ns); `rule` says which (STEP_RULES)."""

    def __init__(self, ts: np.ndarray, dur: np.ndarray, nums: np.ndarray, rule: str = "profiler_step") -> None:
        order = np.argsort(ts, kind="stable")
        self.ts = np.asarray(ts, np.int64)[order]
        self.end = self.ts + np.asarray(dur, np.int64)[order]
        self.nums = np.asarray(nums, np.int64)[order]
        self.order = order
        self.rule = rule

    @classmethod
    def from_table(cls, steps: pa.Table) -> "StepWindows":
        col = lambda c: steps.column(c).fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)  # noqa: E731
        return cls(col("ts"), col("dur"), col("step"))

    def at(self, t: np.ndarray) -> np.ndarray:
        """Step enclosing each time (-1 outside every step; a zero-length step holds only its start)."""
        if len(self.ts) == 0:
            return np.full(len(t), -1, np.int64)
        i = np.searchsorted(self.ts, t, side="right") - 1
        ok = i >= 0
        ic = np.where(ok, i, 0)
        inside = ok & ((t < self.end[ic]) | (t == self.ts[ic]))
        return np.where(inside, self.nums[ic], -1)


def iteration_windows(name_dict: list, name_codes: np.ndarray, op_rows: np.ndarray, ts: np.ndarray,
                      end: np.ndarray, tid: np.ndarray, span: tuple[int, int]) -> StepWindows | None:
    """Iterations of a trace without `ProfilerStep` (None when it does not repeat), by the first rule that
    finds at least two: optimizer steps (an iteration ends where `Optimizer.step#...` ends), CUDA/HIP
    graph launches (one starts at each `cudaGraphLaunch`), repeated top-level host op sequences (the
    shortest block of top-level op names that repeats back to back over at least half of them, counted
    from the end: warm-up differs). The iterations tile `span` (the trace's first to last event): the
    first starts at its start, the last ends at its end, so no device work falls outside them.

    op_rows: host rows of category cpu_op / user_annotation; ts/end/tid: every row's."""
    names = np.array([nm or "" for nm in name_dict] + [""], dtype=object)
    op_names = names[name_codes[op_rows]] if len(op_rows) else np.zeros(0, object)
    opt = op_rows[np.array([bool(OPTIMIZER_STEP_RE.match(n)) for n in op_names], bool)] if len(op_rows) else op_rows
    if len(opt) >= 2:
        return _tiled(np.sort(end[opt])[:-1], span, "optimizer_step")
    launch_codes = [c for c, nm in enumerate(name_dict) if nm in GRAPH_LAUNCH_NAMES]
    launches = np.flatnonzero(np.isin(name_codes, launch_codes)) if launch_codes else np.zeros(0, np.int64)
    if len(launches) >= 2:
        return _tiled(np.sort(ts[launches])[1:], span, "graph_launch")
    starts = _repeated_block_starts(name_codes, op_rows, ts, end, tid)
    if starts is not None:
        return _tiled(starts[1:], span, "repeated_ops")
    return None


def _tiled(cuts: np.ndarray, span: tuple[int, int], rule: str) -> StepWindows | None:
    lo, hi = span
    edges = np.unique(np.concatenate(([lo], cuts[(cuts > lo) & (cuts < hi)], [hi]))).astype(np.int64)
    if len(edges) < 3:
        return None
    return StepWindows(edges[:-1], np.diff(edges), np.arange(len(edges) - 1), rule)


def _repeated_block_starts(name_codes: np.ndarray, op_rows: np.ndarray, ts: np.ndarray, end: np.ndarray,
                           tid: np.ndarray) -> np.ndarray | None:
    """Start times of the repeats of the shortest repeating block of top-level op names on the busiest
    host thread (None when no block repeats over at least half of them)."""
    if len(op_rows) < 2:
        return None
    tids, counts = np.unique(tid[op_rows], return_counts=True)
    rows = op_rows[tid[op_rows] == tids[np.argmax(counts)]]
    rows = rows[np.lexsort((-end[rows], ts[rows]))]
    top, reach = [], None
    for r in rows.tolist():  # top level: not inside the previous top-level op
        if reach is None or ts[r] >= reach:
            top.append(r)
            reach = end[r]
    seq = name_codes[np.array(top, np.int64)]
    n = len(seq)
    for p in range(1, min(n // 2, MAX_PERIOD_OPS) + 1):
        if seq[n - 1 - p] != seq[n - 1] or not np.array_equal(seq[n - 2 * p:n - p], seq[n - p:]):
            continue
        k = 2
        while (k + 1) * p <= n and np.array_equal(seq[n - (k + 1) * p:n - k * p], seq[n - p:]):
            k += 1
        if k * p * 2 >= n:
            first = n - k * p
            return ts[np.array(top[first::p], np.int64)]
        return None
    return None


def kernel_steps(kernel_ts: np.ndarray, launch_ts: np.ndarray, linked: np.ndarray,
                 windows: StepWindows, any_linked: bool | None = None,
                 first_linked_ts: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(step, carry_over) of each kernel: the step of its launch; carry-over when unlinked and earlier
    than the first linked kernel. `any_linked`/`first_linked_ts` give those facts for the whole trace
    when the kernels come in parts (chunked driver); by default they are computed from these kernels."""
    if any_linked is None:
        any_linked = bool(linked.any())
    if not any_linked:  # nothing links kernels to launches: their own start decides
        return windows.at(kernel_ts), np.zeros(len(kernel_ts), bool)
    if first_linked_ts is None:
        first_linked_ts = int(kernel_ts[linked].min())
    step = np.where(linked, windows.at(np.where(linked, launch_ts, 0)), -1)
    carry = ~linked & (kernel_ts < first_linked_ts)
    return step, carry


def device_windows(steps: pa.Table, kernels: pa.Table) -> pa.Table:
    """`steps` with `device_ts`/`device_dur`: first start / last end of the kernels of each step."""
    n = steps.num_rows
    dts = np.full(n, -1, np.int64)
    dend = np.full(n, -1, np.int64)
    if n and kernels.num_rows:
        k = kernels.filter(pc.is_valid(kernels["step"]))
        ks = k.column("step").to_numpy(zero_copy_only=False).astype(np.int64)
        kts = k.column("ts").to_numpy(zero_copy_only=False).astype(np.int64)
        kend = kts + k.column("dur").fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
        nums = steps.column("step").to_numpy(zero_copy_only=False).astype(np.int64)
        for i, s in enumerate(nums.tolist()):
            m = ks == s
            if m.any():
                dts[i], dend[i] = kts[m].min(), kend[m].max()
    has = dts >= 0
    steps = _set(steps, "device_ts", pa.array(dts, pa.int64(), mask=~has))
    return _set(steps, "device_dur", pa.array(dend - dts, pa.int64(), mask=~has))


def _set(table: pa.Table, name: str, arr: pa.Array) -> pa.Table:
    if name in table.column_names:
        return table.set_column(table.column_names.index(name), name, arr)
    return table.append_column(name, arr)


# ----------------------------------------------------------------------------------------------
# process groups

# DeviceMesh / torchtitan axis names -> our dims. Longer names first so dp_shard wins over dp.
AXIS_DIMS = (
    ("dp_shard_cp", "fsdp"), ("dp_replicate", "dp"), ("dp_shard", "fsdp"), ("fsdp", "fsdp"),
    ("hsdp", "dp"), ("dp_cp", "dp"), ("edp", "dp"), ("dp", "dp"), ("ddp", "dp"), ("tp", "tp"),
    ("sp", "tp"), ("pp", "pp"), ("cp", "cp"), ("ep", "ep"), ("moe", "ep"),
)
# Flattened DeviceMesh axes (groups spanning several basic axes) -> the basic axes they span.
FLATTENED_AXES = {"dp_cp": ["dp", "cp"], "dp_shard_cp": ["fsdp", "cp"], "edp": ["dp", "cp"]}
_DESC = re.compile(r"^(?:mesh_|group_|pg_)?([a-z_]+?)(?:_group|_pg)?(?:_\d+)?$")


def _axis_token(desc: str) -> str:
    d = desc.strip().lower()
    m = _DESC.match(d)
    return m.group(1) if m else d


def dim_from_desc(desc: str | None) -> str | None:
    """`mesh_tp` -> tp, `mesh_dp_shard` -> fsdp, `default_pg` -> world; None when it names no dim."""
    if not desc:
        return None
    if desc.strip().lower() in ("default_pg", "world", "global"):
        return "world"
    token = _axis_token(desc)
    return next((dim for name, dim in AXIS_DIMS if token == name), None)


def flattened_from_desc(desc: str | None) -> list[str] | None:
    """`mesh_dp_cp` -> ["dp", "cp"]: the basic axes a flattened mesh group spans; None for a basic axis."""
    if not desc:
        return None
    axes = FLATTENED_AXES.get(_axis_token(desc))
    return list(axes) if axes else None


def group_dim(pg_desc: str | None, pg_name: str | None = None) -> str:
    """`process_groups.dim` as the parser sees it: from the description (else the name), or "unknown"."""
    return dim_from_desc(pg_desc) or dim_from_desc(pg_name) or "unknown"


# ----------------------------------------------------------------------------------------------
# a whole events table (stores built outside the Kineto decoder: tests, other writers)

GPU_CATS = frozenset({"kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation", "gpu_instant_event", "cuda_sync"})
DEVICE_ROW_KINDS = {"kernel": 0, "gpu_memcpy": 2, "gpu_memset": 3}  # comm kernels are told apart by name


def classify_events(events: pa.Table) -> pa.Table:
    """`events` with `role` and `lane` computed from name / cat / thread_name by the parser's rules
    (device rows: comm kernels by their NCCL/RCCL name, memcpy/memset by category)."""
    names = _dict(events.column("name"))
    cats = events.column("cat").cast(pa.string()).to_pylist()
    threads = _dict(events.column("thread_name"))
    gpu_row = np.array([c in GPU_CATS for c in cats], bool)
    device_rows = np.flatnonzero([c in DEVICE_ROW_KINDS for c in cats])
    name_dict = names.dictionary.to_pylist()
    name_codes = names.indices.fill_null(len(name_dict)).to_numpy(zero_copy_only=False)
    padded = name_dict + [""]
    kind = np.array([1 if is_comm_kernel_name(padded[name_codes[i]] or "") else DEVICE_ROW_KINDS[cats[i]]
                     for i in device_rows.tolist()], np.int8)
    lane = lane_codes(threads.dictionary.to_pylist(), threads.indices.fill_null(-1).to_numpy(zero_copy_only=False),
                      gpu_row)
    role = event_roles(name_dict, name_codes, np.array([c == "cpu_op" for c in cats], bool), lane, device_rows, kind)
    return _set(_set(events, "role", role), "lane", lane_column(lane))


def _dict(col) -> pa.DictionaryArray:
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    arr = arr.cast(pa.string()) if pa.types.is_dictionary(arr.type) else arr
    return arr.dictionary_encode()


# ----------------------------------------------------------------------------------------------
# trace kinds: which accelerator, CUDA-graph capture or replay, training or inference (DESIGN §10)

# Kineto's device/runtime categories of accelerators other than CUDA/ROCm (kineto libkineto/src/ActivityType.cpp):
# their device rows are tabled as kernels / memcpy / memset (OTHER_DEVICE_CATS), and the rank says which it was.
OTHER_DEVICE_CATS = {"mtia_ccp_events": "kernel", "mlu_memcpy": "gpu_memcpy", "mlu_memset": "gpu_memset",
                     "gcu_memcpy": "gpu_memcpy", "gcu_memset": "gpu_memset"}
_ACCELERATOR_CATS = (("mtia_", "mtia"), ("hpu_", "hpu"), ("xpu_", "xpu"), ("mlu_", "mlu"), ("gcu_", "gcu"),
                     ("privateuse1_", "privateuse1"))
BEGIN_CAPTURE_RE = re.compile(r"^(?:cuda|hip)StreamBeginCapture")
END_CAPTURE_RE = re.compile(r"^(?:cuda|hip)StreamEndCapture")
LAUNCH_RE = re.compile(r"^(?:cuda|hip|cu)\w*Launch\w*Kernel|^(?:cuda|hip)LaunchCooperativeKernel")
BACKWARD_RE = re.compile(r"Backward\d*$|^autograd::engine::evaluate_function")  # autograd nodes run in backward
OPTIMIZER_RE = re.compile(r"^Optimizer\.(?:step|zero_grad)#")  # torch.optim's record_function names


def accelerator_of(raw_categories: list, names: list, has_device_rows: bool) -> str | None:
    """The accelerator a trace's device rows come from: mtia / hpu / xpu / mlu / gcu / privateuse1 by Kineto's
    categories, rocm when its runtime calls are HIP's, cuda for other device rows; None without device work."""
    cats = {str(c).strip().lower() for c in raw_categories if c is not None}
    for prefix, kind in _ACCELERATOR_CATS:
        if any(c.startswith(prefix) for c in cats):
            return kind
    if not has_device_rows:
        return None
    return "rocm" if any(isinstance(n, str) and n.startswith("hip") for n in names) else "cuda"


@dataclass(frozen=True)
class Names:
    """A rank's row names as codes into their distinct values (`dict_columns.codes`; a null is ""): a test is
    asked once per distinct name, its answer taken per row by code."""

    codes: np.ndarray
    values: list[str]

    @classmethod
    def of(cls, col: Any) -> "Names":
        row_codes, values = codes(col)
        return cls(row_codes, ["" if v is None else str(v) for v in values])

    def matches(self, test: Callable[[str], Any]) -> np.ndarray:
        """Per row: whether `test` (a compiled pattern's match / search) finds its name."""
        return np.array([test(v) is not None for v in self.values], bool)[self.codes]

    def among(self, names: frozenset[str]) -> np.ndarray:
        return np.array([v in names for v in self.values], bool)[self.codes]


def graph_mode(names: Names, ts: np.ndarray, end: np.ndarray, num_kernels: int) -> dict:
    """CUDA/HIP graph use of one rank from its host events (names, start/end ns): capture intervals
    (BeginCapture .. EndCapture: each begin to the first end at or after it), kernel launches inside them
    (captured: recorded, not run), graph launches (replays). mode: `capture_only` (launches captured, no graph
    replayed, fewer kernels ran than were captured), `graph_replay` (graph launches present), else `eager`."""
    begin, finish, launch = (names.matches(rx.match) for rx in (BEGIN_CAPTURE_RE, END_CAPTURE_RE, LAUNCH_RE))
    begins, ends = np.sort(ts[begin]).astype(np.int64), np.sort(end[finish]).astype(np.int64)
    j = np.searchsorted(ends, begins, side="left")
    his = np.where(j < ends.size, ends[np.minimum(j, ends.size - 1)], begins) if ends.size else begins
    captured = 0
    if begins.size:  # a launch inside any span: the furthest end of the spans begun at or before it
        reach = np.maximum.accumulate(his)
        t = ts[launch].astype(np.int64)
        k = np.searchsorted(begins, t, side="right") - 1
        captured = int(((k >= 0) & (t <= reach[np.maximum(k, 0)])).sum())
    replays = int(names.among(GRAPH_LAUNCH_NAMES).sum())
    if begins.size and captured and not replays and num_kernels < captured:
        mode = "capture_only"
    elif replays:
        mode = "graph_replay"
    else:
        mode = "eager"
    return {"mode": mode, "captures": int(begins.size), "captured_launches": captured, "graph_launches": replays,
            "kernels_run": int(num_kernels)}


def workload_of(names: Names, num_host_ops: int) -> dict:
    """training when the host ran autograd backward nodes or an optimizer step, inference when it ran ops
    but neither, unknown without host ops."""
    backward = int(names.matches(BACKWARD_RE.search).sum())
    optimizer = int(names.matches(OPTIMIZER_RE.match).sum())
    kind = "training" if backward or optimizer else ("inference" if num_host_ops else "unknown")
    return {"workload": kind, "backward_ops": backward, "optimizer_steps": optimizer}
