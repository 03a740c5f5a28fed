"""One declaration per table of a run store (DESIGN §2): column types and per-column docs.

Parsers write tables that conform to these schemas, `tracekit query` prints them, tests check
against them. Times are int64 nanoseconds on the rank's own clock; `rank` is int32 everywhere.
"""

from __future__ import annotations

import pyarrow as pa

from tracekit.collectives import COLLECTIVE_OPS  # noqa: F401  (the table vocabulary: collectives.op)

NS = "int64 nanoseconds on the rank's clock"


def column(name: str, typ: pa.DataType, doc: str, nullable: bool = True) -> pa.Field:
    """A declared column: its type and its doc (shown by `tracekit query --schema`)."""
    return pa.field(name, typ, nullable=nullable, metadata={"doc": doc})


_f = column


DICT_STR = pa.dictionary(pa.int32(), pa.string())

RANKS = pa.schema([
    _f("rank", pa.int32(), "global rank of the trace's process", nullable=False),
    _f("world_size", pa.int32(), "world size stated by the trace or manifest (null if unknown)"),
    _f("hostname", pa.string(), "host name (distributedInfo, manifest, or null)"),
    _f("host_cpus", pa.int32(), "CPU cores the host's ranks may run on (manifest host_cpus; null if unknown)"),
    _f("cpu_wait_share", pa.float64(), "share of the rank's runnable time its threads waited for a core over the "
       "profiled steps (tracekit record's run-queue wait / (wait + CPU time); null if not recorded)"),
    _f("cpu_runnable_ns", pa.int64(), "the rank's threads' runnable time (CPU + run-queue wait) per profiled step, "
       "ns (tracekit record's cpu_window; null if not recorded)"),
    _f("backend", pa.string(), "distributed backend: nccl, gloo, rccl... (null if unknown)"),
    _f("device_names", pa.list_(pa.string()), "device names from deviceProperties"),
    _f("device_memory_bytes", pa.list_(pa.int64()), "memory of each device in device_names (totalGlobalMem)"),
    _f("source_file", pa.string(), "path of the trace file this rank was read from"),
    _f("schema_version", pa.string(), "Kineto schemaVersion as text (null if absent)"),
    _f("rank_source", pa.string(), "where the rank came from: distributedInfo | filename | manifest"),
    _f("trace_kind", pa.string(), "gpu when device kernels exist, else cpu"),
    _f("accelerator", pa.string(), "where the device rows come from (parse/classify.py accelerator_of): "
       "cuda | rocm | mtia | hpu | xpu | mlu | gcu | privateuse1; null without device work"),
    _f("base_time_ns", pa.int64(), "baseTimeNanoseconds when present"),
    _f("first_ts", pa.int64(), "earliest event start, " + NS),
    _f("last_ts", pa.int64(), "latest event end, " + NS),
    _f("num_events", pa.int64(), "complete events parsed"),
    _f("clock_offset_ns", pa.int64(), "this rank's clock minus rank 0's (null if not estimated)"),
    _f("parse_warnings", pa.list_(pa.string()), "non-fatal problems found while parsing"),
])

PROCESS_GROUPS = pa.schema([
    _f("pg_name", pa.string(), "process group name (pg_config pg_name / Flight Recorder name)", nullable=False),
    _f("pg_desc", pa.string(), "description (pg_desc, e.g. mesh_tp; uid when pg_desc is absent)"),
    _f("ranks", pa.list_(pa.int32()), "global ranks of the group"),
    _f("size", pa.int32(), "group size"),
    _f("backend", pa.string(), "backend_config of the group"),
    _f("dim", pa.string(), "parallel dim named by pg_desc (mesh_tp -> tp, default_pg -> world; "
       "parse/classify.py): dp|fsdp|tp|pp|cp|ep|world|unknown. The layout analyzer adds manifest/structure evidence"),
    _f("seen_by", pa.list_(pa.int32()), "ranks whose trace/log described this group"),
])

EVENTS = pa.schema([
    _f("rank", pa.int32(), "global rank", nullable=False),
    _f("name", DICT_STR, "event name"),
    _f("cat", DICT_STR, "normalised lower-case category (cpu_op, kernel, user_annotation, ...)"),
    _f("ts", pa.int64(), "start, " + NS, nullable=False),
    _f("dur", pa.int64(), "duration in ns (negative/missing durations become null)"),
    _f("pid", pa.int64(), "process id (device id for GPU rows)"),
    _f("tid", pa.int64(), "thread id, or stream number for GPU rows"),
    _f("thread_name", DICT_STR, "thread name from metadata (e.g. pt_gloo_runloop), null if none"),
    _f("stream", pa.int32(), "GPU stream for device rows, null for host rows"),
    _f("correlation", pa.int64(), "CUDA/HIP correlation id"),
    _f("external_id", pa.int64(), "External id joining CPU ops and kernels"),
    _f("step", pa.int32(), "host rows: ProfilerStep number enclosing the event start; device rows: the "
       "step of the launching CPU op (kernels.step); null outside steps"),
    _f("flops", pa.float64(), "FLOP count when the profiler recorded it (with_flops)"),
    _f("role", DICT_STR, "what the event is, decided in parse/classify.py: compute (cpu_op on a training "
       "thread; compute kernel) | comm (collective calls c10d::/_c10d_functional/record_param_comms/nccl:/gloo:/"
       "comm:, comm-thread events, comm kernels) | memcpy | memset | step_annotation (ProfilerStep#N, any "
       "category; never compute) | data_load (PyTorch's enumerate(DataLoader)#...) | overhead (tracekit::...) | "
       "other (incl. users' record_function labels such as data:load or fwd: no host activity by themselves)"),
    _f("lane", DICT_STR, "host (training/other threads) | comm_thread (gloo/NCCL worker threads) | device"),
    _f("input_dims", DICT_STR, "args 'Input Dims' of a CPU op recorded with record_shapes, as its JSON text "
       "(a list per input: [] for scalars, nested lists for tensor lists); null when absent"),
    _f("input_types", DICT_STR, "args 'Input type' as JSON text (e.g. [\"c10::BFloat16\", \"Scalar\"]); null when absent"),
    _f("input_strides", DICT_STR, "args 'Input Strides' as JSON text; null when absent"),
    _f("concrete_inputs", DICT_STR, "args 'Concrete Inputs' as JSON text (scalar arguments as strings, "
       "e.g. is_causal 'True'); null when absent"),
    _f("launch_kernel", DICT_STR, "runtime launch calls: args 'kernel', the kernel the call launched (ROCm traces, "
       "CUDA-graph capture traces); null otherwise"),
])

KERNELS = pa.schema([
    _f("rank", pa.int32(), "global rank", nullable=False),
    _f("name", DICT_STR, "kernel / memcpy / memset name"),
    _f("stream", pa.int32(), "device stream"),
    _f("device", pa.int32(), "device index"),
    _f("ts", pa.int64(), "start, " + NS, nullable=False),
    _f("dur", pa.int64(), "duration in ns"),
    _f("kind", DICT_STR, "compute | comm (collective args or nccl/rccl kernel name) | memcpy | memset"),
    _f("correlation", pa.int64(), "correlation id to the runtime call"),
    _f("external_id", pa.int64(), "External id to the CPU op"),
    _f("collective_op", DICT_STR, "normalised collective op for comm kernels (null otherwise)"),
    _f("pg_name", pa.string(), "process group of a comm kernel when known"),
    _f("step", pa.int32(), "ProfilerStep number of the CPU runtime call that launched the kernel (same "
       "correlation id); null when unlinked or launched outside steps. Only when nothing in the trace links "
       "kernels to launches: the step window enclosing the kernel's start"),
    _f("carry_over", pa.bool_(), "no launch in the trace and starts before the first linked kernel: work "
       "left over from before profiling (step null)"),
])

COLLECTIVES = pa.schema([
    _f("rank", pa.int32(), "global rank", nullable=False),
    _f("source", DICT_STR, "kineto | comms-log | flight-recorder"),
    _f("pg_name", pa.string(), "process group name (null if unknown)"),
    _f("pg_desc", pa.string(), "process group description"),
    _f("seq", pa.int64(), "collective (or p2p) sequence number within the group; null if unknown"),
    _f("seq_source", pa.string(), "where seq came from: args | log | order (position within group)"),
    _f("op", DICT_STR, "all_reduce, all_gather, reduce_scatter, all_to_all, broadcast, reduce, send, recv, barrier, gather, scatter, unknown"),
    _f("is_p2p", pa.bool_(), "send/recv"),
    _f("peer", pa.int32(), "global peer rank for p2p when known"),
    _f("in_nelems", pa.int64(), "input elements"),
    _f("out_nelems", pa.int64(), "output elements"),
    _f("dtype", pa.string(), "element type as written by the source (Float, BFloat16, float32...)"),
    _f("bytes", pa.int64(), "message size used for bandwidth: max(in, out) nelems x element size; null when "
       "unknown (never guessed)"),
    _f("size_note", pa.string(), "why bytes is null (e.g. a DDP bucket's TensorList whose sizes were not "
       "recorded, an unknown dtype); null when bytes is known"),
    _f("in_split_sizes", pa.list_(pa.int64()), "all_to_all input split sizes"),
    _f("out_split_sizes", pa.list_(pa.int64()), "all_to_all output split sizes"),
    _f("group_size", pa.int32(), "size of the group"),
    _f("group_ranks", pa.list_(pa.int32()), "global ranks of the group when known"),
    _f("ts", pa.int64(), "start of the communication itself (device kernel / gloo worker / log start), " + NS),
    _f("dur", pa.int64(), "duration of the communication itself in ns"),
    _f("enqueue_ts", pa.int64(), "when the caller issued it (CPU op start / log created), " + NS),
    _f("enqueue_dur", pa.int64(), "duration of the issuing CPU op in ns"),
    _f("state", pa.string(), "completed | started | scheduled | unknown"),
    _f("name", pa.string(), "raw event or profiling name"),
    _f("caller", pa.string(), "innermost enclosing user annotation (record_function label), if any"),
    _f("correlation", pa.int64(), "correlation of the comm kernel when on GPU"),
    _f("external_id", pa.int64(), "External id of the CPU op"),
    _f("step", pa.int32(), "ProfilerStep number at enqueue"),
    _f("match_note", pa.string(), "how the group was found when the source named none (inferred from the "
       "rank's only fitting group), or why the row has no group and stays out of cross-rank matching"),
])

STEPS = pa.schema([
    _f("rank", pa.int32(), "global rank", nullable=False),
    _f("step", pa.int32(), "step number from ProfilerStep#N", nullable=False),
    _f("ts", pa.int64(), "start of the host ProfilerStep annotation, " + NS, nullable=False),
    _f("dur", pa.int64(), "duration in ns"),
    _f("device_ts", pa.int64(), "first start of this step's kernels (kernels.step), " + NS + "; null without kernels"),
    _f("device_dur", pa.int64(), "last end minus first start of this step's kernels in ns; null without kernels"),
    _f("rule", pa.string(), "how the step was found (parse/classify.py STEP_RULES): profiler_step (ProfilerStep#N); "
       "on a trace without them, iterations where it repeats: optimizer_step | graph_launch | repeated_ops"),
])

ROUTING = pa.schema([
    _f("rank", pa.int32(), "global rank that recorded the statistic", nullable=False),
    _f("step", pa.int32(), "training step", nullable=False),
    _f("layer", pa.int32(), "MoE layer index", nullable=False),
    _f("expert", pa.int32(), "global expert index", nullable=False),
    _f("tokens", pa.int64(), "tokens routed to the expert (before capacity)"),
    _f("dropped", pa.int64(), "tokens dropped by capacity"),
    _f("capacity", pa.int64(), "expert capacity in tokens (null if unlimited)"),
])

PIPELINE = pa.schema([
    _f("rank", pa.int32(), "global rank", nullable=False),
    _f("step", pa.int32(), "training step"),
    _f("stage", pa.int32(), "pipeline stage (virtual stage index for interleaved schedules)"),
    _f("microbatch", pa.int32(), "micro-batch index"),
    _f("phase", DICT_STR, "fwd | bwd | bwd_input | bwd_weight | send | recv"),
    _f("ts", pa.int64(), "start, " + NS, nullable=False),
    _f("dur", pa.int64(), "duration in ns"),
])

MEMORY = pa.schema([
    _f("rank", pa.int32(), "global rank", nullable=False),
    _f("ts", pa.int64(), "time of the allocation or free, " + NS, nullable=False),
    _f("device_type", pa.int32(), "profiler device type: 0 cpu, 1 cuda, ... (c10::DeviceType)"),
    _f("device", pa.int32(), "device index (-1 for host memory)"),
    _f("bytes", pa.int64(), "allocation (> 0) or free (< 0) in bytes"),
    _f("total_allocated", pa.int64(), "bytes allocated on the device after this event, as the profiler's "
       "allocator counts them (CUDA: the caching allocator's total; CPU: only memory allocated while the "
       "profiler was recording)"),
    _f("total_reserved", pa.int64(), "bytes reserved by the caching allocator after this event (0 on CPU)"),
    _f("addr", pa.int64(), "address of the block (pairs an allocation with its free)"),
    _f("step", pa.int32(), "ProfilerStep number enclosing the event (null outside steps)"),
])

MEMORY_SEGMENTS = pa.schema([
    _f("rank", pa.int32(), "global rank whose allocator snapshot this is", nullable=False),
    _f("device", pa.int32(), "CUDA device index"),
    _f("segment_addr", pa.int64(), "address of the segment (one cudaMalloc)"),
    _f("segment_size", pa.int64(), "bytes of the segment"),
    _f("segment_type", pa.string(), "large | small pool"),
    _f("block_addr", pa.int64(), "address of the block inside the segment (null for a segment row)"),
    _f("block_size", pa.int64(), "bytes of the block"),
    _f("block_state", pa.string(), "active_allocated | active_pending_free | inactive"),
    _f("frame", pa.string(), "innermost recorded Python frame of the allocation (file:line function), if any"),
])

OPS = pa.schema([
    _f("rank", pa.int32(), "global rank", nullable=False),
    _f("step", pa.int32(), "ProfilerStep number of the op (null outside steps)"),
    _f("name", DICT_STR, "CPU op that launched the kernels (innermost op: its kernels' External id)"),
    _f("category", DICT_STR, "gemm | attention | conv | elementwise | norm | reduce | comm | memcpy | other "
       "(parse/op_shapes.py)"),
    _f("ts", pa.int64(), "host start of the op, " + NS),
    _f("dur", pa.int64(), "host duration of the op in ns"),
    _f("external_id", pa.int64(), "External id joining the op and its kernels"),
    _f("dtype", DICT_STR, "element type of the op's first tensor input (bf16, fp16, fp32, fp8...); null if unknown"),
    _f("input_dims", DICT_STR, "the op's Input Dims (compact JSON)"),
    _f("input_types", DICT_STR, "the op's Input type (compact JSON)"),
    _f("concrete_inputs", DICT_STR, "the op's Concrete Inputs (compact JSON)"),
    _f("kernel_count", pa.int32(), "kernels the op launched (memset/memcpy included)"),
    _f("kernel_ns", pa.int64(), "sum of the durations of the op's kernels in ns (its device time)"),
    _f("kernel_ts", pa.int64(), "start of the op's first kernel, " + NS),
    _f("kernel_end", pa.int64(), "end of the op's last kernel, " + NS),
    _f("flops", pa.int64(), "floating-point operations from the shapes (docs/metrics.md); null when unknown"),
    _f("bytes", pa.int64(), "bytes the op reads and writes, from the shapes; null when unknown"),
    _f("gemm_batch", pa.int64(), "GEMM batch count (1 for mm/addmm); null for other ops"),
    _f("gemm_m", pa.int64(), "GEMM M (rows of the output)"),
    _f("gemm_n", pa.int64(), "GEMM N (columns of the output)"),
    _f("gemm_k", pa.int64(), "GEMM K (reduction size)"),
    _f("formula", DICT_STR, "rule that gave flops/bytes: gemm, attention_fwd[_causal], attention_bwd[_causal], "
       "conv_fwd, conv_bwd, elementwise, data_movement, norm_fwd, norm_bwd, softmax, reduce, embedding, memcpy, "
       "triton_tensors, *_unknown; null: no rule for the op"),
    _f("launch", DICT_STR, "direct (the op launched its kernels) | graph (kernels a CUDA/HIP graph replay ran, named "
       "by the op that captured them: name and shapes from the capture trace; ts/dur/external_id null) | "
       "graph_unmatched (graph kernels without a capture: one row per graph launch, named by the launch call)"),
    _f("graph_correlation", pa.int64(), "correlation id of the graph launch call (graph rows)"),
])

KERNEL_SUMMARY = pa.schema([
    _f("rank", pa.int32(), "global rank", nullable=False),
    _f("name", DICT_STR, "kernel / memcpy / memset name"),
    _f("stream", pa.int32(), "device stream"),
    _f("kind", DICT_STR, "compute | comm | memcpy | memset (kernels.kind)"),
    _f("category", DICT_STR, "category of the op that launched it (ops.category), else from the kernel name"),
    _f("count", pa.int64(), "launches"),
    _f("total_ns", pa.int64(), "summed duration in ns"),
    _f("mean_ns", pa.float64(), "mean duration in ns"),
    _f("max_ns", pa.int64(), "longest duration in ns"),
    _f("share", pa.float64(), "total_ns / the rank's summed kernel time"),
])

FR_ENTRIES = pa.schema([
    _f("rank", pa.int32(), "global rank whose Flight Recorder dump (or tracekit comms log) holds the entry", nullable=False),
    _f("source", pa.string(), "flight-recorder | comms-log"),
    _f("record_id", pa.int64(), "the recorder's running entry id on this rank (issue order); null if absent"),
    _f("pg_id", pa.string(), "the rank's own id of the process group (keys pg_status; differs across ranks)"),
    _f("pg_name", pa.string(), "process group name (pg_config key, the same on every member)"),
    _f("pg_desc", pa.string(), "process group description (e.g. EXPERT_MODEL_PARALLEL_GROUP)"),
    _f("seq", pa.int64(), "collective_seq_id (p2p_seq_id for send/recv)"),
    _f("is_p2p", pa.bool_(), "send/recv"),
    _f("op", pa.string(), "normalised op (all_reduce, all_to_all, send, recv, ...)"),
    _f("name", pa.string(), "profiling_name as recorded (nccl:all_to_all, gloo:all_reduce, nccl:send 0->1)"),
    _f("peer", pa.int32(), "global peer rank of a send/recv when known"),
    _f("in_sizes", pa.string(), "input tensor shapes as text, e.g. 2048x5120 (tensors separated by ', ')"),
    _f("out_sizes", pa.string(), "output tensor shapes as text"),
    _f("dtype", pa.string(), "input dtypes as recorded (tensors separated by ', ')"),
    _f("out_dtype", pa.string(), "output dtypes as recorded"),
    _f("state", pa.string(), "scheduled | started | completed (as the recorder last saw it)"),
    _f("retired", pa.bool_(), "the recorder retired the entry (its work finished); null if not recorded"),
    _f("enqueue_ts", pa.int64(), "time_created_ns (wall clock ns, unshifted)"),
    _f("start_ts", pa.int64(), "time_discovered_started_ns (null when never observed)"),
    _f("end_ts", pa.int64(), "time_discovered_completed_ns (null when never observed)"),
    _f("frames", pa.string(), "the entry's Python stack, innermost first, one 'file:line name' per line"),
])

FR_STATUS = pa.schema([
    _f("rank", pa.int32(), "global rank of the dump", nullable=False),
    _f("source_file", pa.string(), "the dump or log file"),
    _f("version", pa.string(), "dump schema version (e.g. 2.9)"),
    _f("num_entries", pa.int32(), "entries the dump holds (0: the rank's recorder kept nothing)"),
    _f("pg_id", pa.string(), "pg_status key (the rank's own group id); null on the row of a dump with no pg_status"),
    _f("pg_name", pa.string(), "the group's name when the rank's own entries map its pg_id to it, else null"),
    _f("last_enqueued", pa.int64(), "pg_status last_enqueued_collective (-1: none)"),
    _f("last_started", pa.int64(), "pg_status last_started_collective (-1: none or not timed)"),
    _f("last_completed", pa.int64(), "pg_status last_completed_collective (-1: none)"),
    _f("dead", pa.bool_(), "the rank's process died before the dump (tracekit record's watchdog), null if unknown"),
])

TABLES: dict[str, pa.Schema] = {
    "ranks": RANKS,
    "process_groups": PROCESS_GROUPS,
    "events": EVENTS,
    "kernels": KERNELS,
    "collectives": COLLECTIVES,
    "steps": STEPS,
    "routing": ROUTING,
    "pipeline": PIPELINE,
    "memory": MEMORY,
    "memory_segments": MEMORY_SEGMENTS,
    "ops": OPS,
    "kernel_summary": KERNEL_SUMMARY,
    "fr_entries": FR_ENTRIES,
    "fr_status": FR_STATUS,
}

# Tables with one row group per rank; the others are small and written whole.
PER_RANK_TABLES = ("events", "kernels", "collectives", "steps", "routing", "pipeline", "memory", "memory_segments",
                   "ops", "kernel_summary", "fr_entries", "fr_status")

# One spelling of the profiler step annotation for the whole project.
STEP_PATTERN = r"^ProfilerStep#(\d+)$"

KERNEL_KINDS = ("compute", "comm", "memcpy", "memset")
EVENT_ROLES = ("compute", "comm", "memcpy", "memset", "step_annotation", "data_load", "overhead", "other")
LANES = ("host", "comm_thread", "device")
PARALLEL_DIMS = ("dp", "fsdp", "tp", "pp", "cp", "ep", "world", "unknown")


def empty(name: str) -> pa.Table:
    """An empty table of the named schema."""
    return TABLES[name].empty_table()


def conform(name: str, table: pa.Table) -> pa.Table:
    """Cast/reorder `table` to the declared schema; missing nullable columns become nulls. A table already
    of the schema (metadata included) is returned as it is (what rebuilding it gives; at 10,000 ranks each
    log-only rank's collectives are conformed by the log reader and again by the store's writer)."""
    schema = TABLES[name]
    if table.schema.equals(schema, check_metadata=True):
        return table
    have = set(table.column_names)  # once: the property builds a new list each time (~8 µs for 20 columns)
    cols = []
    for field in schema:
        if field.name in have:
            col = table.column(field.name)
            if col.type != field.type:
                col = col.cast(field.type)
            cols.append(col)
        else:
            if not field.nullable:
                raise ValueError(f"table {name!r} lacks required column {field.name!r}")
            cols.append(pa.nulls(table.num_rows, field.type))
    return pa.Table.from_arrays(cols, schema=schema)


def describe(name: str) -> str:
    """Human-readable column listing for `tracekit query --schema`."""
    return describe_schema(f"{name}:", TABLES[name])


def describe_schema(title: str, schema: pa.Schema) -> str:
    """`title`, then one line per column: name, type, doc."""
    lines = [title]
    for field in schema:
        doc = (field.metadata or {}).get(b"doc", b"").decode()
        lines.append(f"  {field.name:<16} {str(field.type):<40} {doc}")
    return "\n".join(lines)
