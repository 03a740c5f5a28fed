"""The typed analysis document: one msgspec Struct per analysis.json section, the finding, the document.

analysis.json is encoded from `AnalysisDocument` (tracekit/document/convert.py) and its JSON schema
generated from these structs (tracekit/document/schema.py). Field order is the key order analysis.json
has always had; a key written only in some cases is `... | UnsetType = UNSET` (absent when unset, never
null); a key always written has a default only so that a reader can decode a partial or older document
(the generated schema lists it as required). Numbers that may be fractional are `Num` (int | float), so
an integer stays an integer and a float a float, byte for byte.

Keys added to analysis.json after a section was typed are `UNSET`-optional too (an older analysis.json
lacks them; the schema does not require them): inputs.rank_spans, inputs.log_only_ranks,
inputs.traced_ranks, inputs.runs[].span_ns, the ops ranks'
HFU fields, recording.recorder_overhead, the step timeline's drawn / summarised ranks.

Typed: every section's own keys, and the rows the report, diff, check and advisor read. Left as
`dict[str, Any]` (their keys are data, or vary by finding kind): a finding's `evidence`, a straggler's
`cause_evidence`, the analyzers' echoed `thresholds`, maps keyed by rank / dim / label / host
(`coords`, `mesh_shape`, `by_dim`, `stall_labels`, `by_category`...), the hang post-mortem's nested
group / root-cause records, and the `advice` section's advice document (tracekit/schemas/advice.schema.json).
"""

from typing import Any, Union

import msgspec
from msgspec import UNSET, UnsetType

from tracekit.findings.finding import ANALYSIS_KINDS

ANALYSIS_KIND_NAMES = frozenset(k.value for k in ANALYSIS_KINDS)

ANALYSIS_SCHEMA = "tracekit.analysis/1"

Num = Union[int, float]
"""A number kept as it was written: an int stays an int, a float a float."""


class Struct(msgspec.Struct):
    """Base of the document's structs (decoding ignores keys a newer tracekit added)."""


class RankBreakdown(Struct):
    """Per rank totals over the analyzed steps (`breakdown.ranks`, also the document's `ranks`)."""

    rank: int = 0
    steps: int = 0
    step_ns: int = 0
    compute_ns: int = 0
    comm_ns: int = 0
    exposed_comm_ns: int = 0
    other_ns: int = 0
    idle_ns: int = 0
    overlap_ratio: Num | None = None
    bound: str = ""
    sync_wait_ns: int | UnsetType = UNSET
    """part of exposed_comm_ns spent waiting for late peers"""
    exposed_transfer_ns: int | UnsetType = UNSET
    """exposed_comm_ns - sync_wait_ns"""
    carry_over_ns: int | UnsetType = UNSET
    """device time of kernels left over from before profiling (in no step)"""
    waited_for: dict[str, int] | UnsetType = UNSET
    """sync_wait_ns split by the rank waited for (key: that rank; a collective's last arrival, a P2P op's
    peer); sums to sync_wait_ns"""


class InputsRunsRow(Struct):
    ranks: list[int] = msgspec.field(default_factory=list)
    start_ns: int = 0
    end_ns: int = 0
    span_ns: int | UnsetType = UNSET
    """absent in analyses written before it (as the other keys added later: readers see UNSET)"""

class InputsRankSpansRow(Struct):
    rank: int = 0
    span_ns: int = 0

class InputsTimeScaleGroupsRow(Struct):
    ranks: list[int] = msgspec.field(default_factory=list)
    median_ns: int = 0

class InputsTimeScale(Struct):
    measure: str = ""
    groups: list[InputsTimeScaleGroupsRow] = msgspec.field(default_factory=list)
    suspect_ranks: list[Any] = msgspec.field(default_factory=list)

class InputsSection(Struct):
    """Section `inputs` (tracekit/analyze: the analyzer of that name; its module docstring defines it)."""

    world_size: int | None = None
    ranks: list[int] = msgspec.field(default_factory=list)
    missing_ranks: list[int] = msgspec.field(default_factory=list)
    empty_ranks: list[int] = msgspec.field(default_factory=list)
    log_only_ranks: list[int] | UnsetType = UNSET
    traced_ranks: list[int] | UnsetType = UNSET
    skipped: int = 0
    runs: list[InputsRunsRow] = msgspec.field(default_factory=list)
    world_sizes: dict[str, list[int]] = msgspec.field(default_factory=dict)
    rank_spans: list[InputsRankSpansRow] | UnsetType = UNSET
    time_scale: InputsTimeScale = msgspec.field(default_factory=InputsTimeScale)
    warnings: list[str] = msgspec.field(default_factory=list)

class LayoutGroupsRow(Struct):
    pg_name: str = ""
    pg_desc: str | None = None
    dim: str = ""
    ranks: list[int] = msgspec.field(default_factory=list)
    size: int = 0
    inferred_from: str = ""
    confidence: str = ""
    flattened: list[str] | UnsetType = UNSET

class LayoutRanksRow(Struct):
    rank: int = 0
    coords: dict[str, int] = msgspec.field(default_factory=dict)

class LayoutSection(Struct):
    """Section `layout` (tracekit/analyze: the analyzer of that name; its module docstring defines it)."""

    world_size: int | None = None
    groups: list[LayoutGroupsRow] = msgspec.field(default_factory=list)
    ranks: list[LayoutRanksRow] = msgspec.field(default_factory=list)
    mesh_shape: dict[str, int] = msgspec.field(default_factory=dict)
    dims_inferred_from: dict[str, str] = msgspec.field(default_factory=dict)

class MatchingSource(Struct):
    method: str = ""
    per_rank: dict[str, str] = msgspec.field(default_factory=dict)

class MatchingP2p(Struct):
    pairs: int = 0
    unpaired: int = 0
    wait_ns: int = 0

class MatchingByGroupRowSkewNs(Struct):
    mean: int = 0
    p50: int = 0
    p95: int = 0
    max: int = 0

class MatchingByGroupRowTransferNs(Struct):
    mean: int = 0
    p50: int = 0
    p95: int = 0
    max: int = 0

class MatchingByGroupRow(Struct):
    pg_name: str = ""
    dim: str = ""
    op: str = ""
    instances: int = 0
    skew_ns: MatchingByGroupRowSkewNs = msgspec.field(default_factory=MatchingByGroupRowSkewNs)
    transfer_ns: MatchingByGroupRowTransferNs = msgspec.field(default_factory=MatchingByGroupRowTransferNs)

class MatchingPerRankRow(Struct):
    rank: int = 0
    instances: int = 0
    last_count: int = 0
    delay_ns: int = 0
    wait_ns: int = 0

class MatchingTopSkewRow(Struct):
    pg_name: str = ""
    dim: str = ""
    seq: int = 0
    op: str = ""
    step: int | None = None
    skew_ns: int = 0
    transfer_ns: int | None = None
    first_rank: int = 0
    last_rank: int = 0
    delay_ns: int = 0

class MatchingSection(Struct):
    source: MatchingSource = msgspec.field(default_factory=MatchingSource)
    supplement: dict[str, int] | UnsetType = UNSET
    p2p_skipped: int = 0
    no_device_time: int = 0
    op_mismatches: int = 0
    no_group: int = 0
    no_group_paired: int = 0
    p2p: MatchingP2p = msgspec.field(default_factory=MatchingP2p)
    seq_basis: dict[str, int] = msgspec.field(default_factory=dict)
    instances: int = 0
    matched: int = 0
    complete: int = 0
    by_group: list[MatchingByGroupRow] = msgspec.field(default_factory=list)
    per_rank: list[MatchingPerRankRow] = msgspec.field(default_factory=list)
    top_skew: list[MatchingTopSkewRow] = msgspec.field(default_factory=list)
    warnings: list[str] | UnsetType = UNSET

class ClocksRanksRow(Struct):
    rank: int = 0
    offset_ns: int | None = None
    mad_ns: int | None = None
    instances: int = 0
    applied: bool = False
    status: str = ""

class ClocksLogToTraceRow(Struct):
    rank: int = 0
    shift_ns: int = 0
    method: str = ""

class ClocksSection(Struct):
    """Section `clocks` (tracekit/analyze: the analyzer of that name; its module docstring defines it)."""

    method: str = ""
    reference_rank: int | None = None
    ranks: list[ClocksRanksRow] = msgspec.field(default_factory=list)
    hosts: int | None | UnsetType = UNSET
    log_to_trace: list[ClocksLogToTraceRow] = msgspec.field(default_factory=list)
    thresholds: dict[str, Any] | UnsetType = UNSET
    note: str | UnsetType = UNSET

class BreakdownRankDetailsRowShares(Struct):
    compute: Num = 0
    exposed_comm: Num = 0
    exposed_transfer: Num = 0
    sync_wait: Num = 0
    other: Num = 0
    idle: Num = 0

class BreakdownRankDetailsRow(Struct):
    rank: int = 0
    trace_kind: str = ""
    comm_source: str = ""
    windows: str = ""
    step_rule: str = ""
    shares: BreakdownRankDetailsRowShares = msgspec.field(default_factory=BreakdownRankDetailsRowShares)
    verdict_evidence: str = ""

class BreakdownStepsRow(Struct):
    rank: int = 0
    step: int | None = None
    ts: int = 0
    step_ns: int = 0
    compute_ns: int = 0
    comm_ns: int = 0
    exposed_comm_ns: int = 0
    other_ns: int = 0
    idle_ns: int = 0
    overlap_ratio: Num | None = None
    bound: str = ""
    sync_wait_ns: int = 0
    exposed_transfer_ns: int = 0

class BreakdownTimeline(Struct):
    lanes: list[str] = msgspec.field(default_factory=list)
    intervals: list[list[Any]] = msgspec.field(default_factory=list)
    max_intervals: int = 0
    min_gap_ns: int = 0
    truncated_ranks: list[Any] = msgspec.field(default_factory=list)
    expanded_ranks: list[dict[str, Any]] | UnsetType = UNSET
    """[{rank, why}]: the ranks drawn lane by lane"""
    summarised_ranks: list[int] | UnsetType = UNSET
    chosen_by: str | UnsetType = UNSET
    """all | busiest | user"""
    ranks_not_in_run: list[int] | UnsetType = UNSET

class BreakdownOwedWaitRow(Struct):
    rank: int = 0
    owed_ns: int = 0
    owed_ns_per_step: int = 0
    by_rank: dict[str, int] = msgspec.field(default_factory=dict)
    """waiting rank -> the wait this rank caused on it"""


class BreakdownSection(Struct):
    """Section `breakdown` (tracekit/analyze: the analyzer of that name; its module docstring defines it)."""

    ranks: list[RankBreakdown] = msgspec.field(default_factory=list)
    owed_wait: list[BreakdownOwedWaitRow] | UnsetType = UNSET
    """per late rank: the wait it caused on the others, most owed first"""
    rank_details: list[BreakdownRankDetailsRow] = msgspec.field(default_factory=list)
    steps: list[BreakdownStepsRow] = msgspec.field(default_factory=list)
    unanalyzed_ranks: list[dict[str, Any]] = msgspec.field(default_factory=list)
    timeline: BreakdownTimeline = msgspec.field(default_factory=BreakdownTimeline)

class RecordingOverheadRow(Struct):
    rank: int = 0
    overhead_ns: int = 0
    step_ns: int = 0
    share: Num | None = None
    by_name: dict[str, Any] = msgspec.field(default_factory=dict)

class RecordingVerdictStabilityRow(Struct):
    rank: int = 0
    bound: str = ""
    runner_up: str | None = None
    steps: int = 0
    margin_share: Num | None = None
    margin_sd_share: Num | None = None
    stable: bool | None = None
    tie: bool | UnsetType = UNSET
    steps_needed: int = 0
    note: str = ""

class RecordingSection(Struct):
    """Section `recording` (tracekit/analyze: the analyzer of that name; its module docstring defines it)."""

    overhead: list[RecordingOverheadRow] = msgspec.field(default_factory=list)
    verdict_stability: list[RecordingVerdictStabilityRow] = msgspec.field(default_factory=list)
    recorder_overhead: dict[str, Any] | None | UnsetType = UNSET
    """{ratio, by_rank, profiled_steps, unprofiled_steps, rule}; null when the recorder did not time unprofiled steps"""

class TraceKindRanksRowGraph(Struct):
    mode: str = ""
    captures: int = 0
    captured_launches: int = 0
    graph_launches: int = 0
    kernels_run: int = 0

class TraceKindRanksRowCarryOver(Struct):
    kernels: int = 0
    ns: int = 0
    share_of_kernel_time: Num = 0

class TraceKindRanksRow(Struct):
    rank: int = 0
    accelerator: str | None = None
    graph: TraceKindRanksRowGraph = msgspec.field(default_factory=TraceKindRanksRowGraph)
    workload: str = ""
    backward_ops: int = 0
    optimizer_steps: int = 0
    carry_over: TraceKindRanksRowCarryOver = msgspec.field(default_factory=TraceKindRanksRowCarryOver)
    step_rule: str | None = None
    steps: int | None = None
    notes: list[str] = msgspec.field(default_factory=list)

class TraceKindSection(Struct):
    """Section `trace_kind` (tracekit/analyze: the analyzer of that name; its module docstring defines it)."""

    ranks: list[TraceKindRanksRow] = msgspec.field(default_factory=list)
    verdict: str | None = None
    no_verdict_reason: str | None = None
    capture_only_ranks: list[int] = msgspec.field(default_factory=list)
    inference_ranks: list[int] = msgspec.field(default_factory=list)
    communication_ranks: list[int] | UnsetType = UNSET
    notes: list[str] = msgspec.field(default_factory=list)

class StragglersRanksRow(Struct):
    rank: int = 0
    instances: int = 0
    last_count: int = 0
    last_share: Num = 0
    last_chance: Num = 0
    delay_ns_per_step: int = 0
    delay_fraction: Num | None = None
    by_dim: dict[str, int] = msgspec.field(default_factory=dict)
    dominance: Num | None = None
    late_with: list[int] | UnsetType = UNSET
    last_share_with: Num | UnsetType = UNSET

class StragglersStragglersRow(Struct):
    rank: int = 0
    cause: str = ""
    cause_evidence: dict[str, Any] = msgspec.field(default_factory=dict)

class StragglersSection(Struct):
    """Section `stragglers` (tracekit/analyze: the analyzer of that name; its module docstring defines it)."""

    steps_counted: int = 0
    mean_step_ns: int = 0
    ranks: list[StragglersRanksRow] = msgspec.field(default_factory=list)
    stragglers: list[StragglersStragglersRow] = msgspec.field(default_factory=list)
    excluded: dict[str, int] | UnsetType = UNSET
    thresholds: dict[str, Any] = msgspec.field(default_factory=dict)
    device_timed: bool | UnsetType = UNSET

class UnoverlappedExposureSource(Struct):
    ranks_by_source: dict[str, int] = msgspec.field(default_factory=dict)
    times: str = ""

class UnoverlappedByDimOpRow(Struct):
    dim: str = ""
    op: str = ""
    instances: int = 0
    comm_ns: int = 0
    exposed_ns: int = 0
    transfer_exposed_ns: int = 0
    overlap_ratio: Num = 0
    exposed_ns_per_step: int = 0
    transfer_exposed_ns_per_step: int = 0
    share_of_step: Num = 0
    worst_rank: int = 0
    bytes_p50: Num | None = None
    calls_per_step: Num = 0

class UnoverlappedByRankDimOpRow(Struct):
    rank: int = 0
    dim: str = ""
    op: str = ""
    instances: int = 0
    comm_ns: int = 0
    exposed_ns: int = 0
    transfer_exposed_ns: int = 0
    steps: int = 0
    step_ns: int = 0
    bytes_p50: Num | None = None

class UnoverlappedGroupRow(Struct):
    """One group of `by_dim`, `by_op`, `by_size` or `by_caller`: its key and what its instances exposed."""

    key: str | None = None
    instances: int = 0
    exposed_ns: int = 0
    transfer_exposed_ns: int = 0

class UnoverlappedTopOffendersRow(Struct):
    rank: int = 0
    pg_name: str | None = None
    dim: str = ""
    op: str = ""
    bytes: int | None = None
    caller: str | None = None
    step: int | None = None
    ts: int = 0
    dur_ns: int = 0
    exposed_ns: int = 0
    transfer_exposed_ns: int = 0
    share_of_step: Num = 0

class UnoverlappedSection(Struct):
    """Section `unoverlapped` (tracekit/analyze: the analyzer of that name; its module docstring defines it)."""

    exposure_source: UnoverlappedExposureSource = msgspec.field(default_factory=UnoverlappedExposureSource)
    instances: int = 0
    exposed_ns: int = 0
    transfer_exposed_ns: int = 0
    by_dim_op: list[UnoverlappedByDimOpRow] = msgspec.field(default_factory=list)
    by_rank_dim_op: list[UnoverlappedByRankDimOpRow] = msgspec.field(default_factory=list)
    by_dim: list[UnoverlappedGroupRow] = msgspec.field(default_factory=list)
    by_op: list[UnoverlappedGroupRow] = msgspec.field(default_factory=list)
    by_size: list[UnoverlappedGroupRow] = msgspec.field(default_factory=list)
    by_caller: list[UnoverlappedGroupRow] = msgspec.field(default_factory=list)
    top_offenders: list[UnoverlappedTopOffendersRow] = msgspec.field(default_factory=list)
    thresholds: dict[str, Any] = msgspec.field(default_factory=dict)

class PipelineStagesRow(Struct):
    stage: int = 0
    ranks: list[int] = msgspec.field(default_factory=list)
    compute_ns: int = 0
    fwd_ns: int | None = None
    bwd_ns: int | None = None
    layers: int | None = None

class PipelinePipelinesRowStepsRowRanksRow(Struct):
    rank: int = 0
    stage_ids: list[int] = msgspec.field(default_factory=list)
    busy_ns: int = 0
    bubble: Num = 0
    bubble_of_step: Num | None = None
    p2p_ns: int | None = None
    p2p_wait_ns: int | None = None

class PipelinePipelinesRowStepsRow(Struct):
    step: int = 0
    window_ns: int = 0
    bubble: Num = 0
    ranks: list[PipelinePipelinesRowStepsRowRanksRow] = msgspec.field(default_factory=list)

class PipelinePipelinesRow(Struct):
    ranks: list[int] = msgspec.field(default_factory=list)
    steps: list[PipelinePipelinesRowStepsRow] = msgspec.field(default_factory=list)

class PipelinePerMicrobatchRow(Struct):
    stage: int = 0
    microbatch: int = 0
    phase: str = ""
    mean_ns: int = 0

class PipelineDiagramIntervalsRow(Struct):
    rank: int = 0
    stage: int = 0
    microbatch: int | None = None
    phase: str = ""
    start_ns: int = 0
    dur_ns: int = 0

class PipelineDiagram(Struct):
    step: int = 0
    ranks: list[int] = msgspec.field(default_factory=list)
    window_ns: int = 0
    intervals: list[PipelineDiagramIntervalsRow] = msgspec.field(default_factory=list)

class PipelineSection(Struct):
    """Section `pipeline` (tracekit/analyze: the analyzer of that name; its module docstring defines it)."""

    source: str | None = None
    schedule: str | None = None
    schedule_detected: str | None = None
    num_stages: int = 0
    chunks_per_rank: int = 0
    num_microbatches: int = 0
    theoretical_bubble: Num | None = None
    measured_bubble: Num | None = None
    imbalance: Num | None = None
    stages: list[PipelineStagesRow] = msgspec.field(default_factory=list)
    pipelines: list[PipelinePipelinesRow] = msgspec.field(default_factory=list)
    per_microbatch: list[PipelinePerMicrobatchRow] = msgspec.field(default_factory=list)
    diagram: PipelineDiagram | None = None
    microbatches_source: str | None | UnsetType = UNSET
    """p2p source only"""
    busy_source: str | UnsetType = UNSET
    """p2p source only"""
    evidence: dict[str, Any] | UnsetType = UNSET
    """p2p source only"""

class HostStallsRanksRow(Struct):
    step_ns: int = 0
    stall_ns: int = 0
    data_load_ns: int = 0
    gap_ns: int = 0
    longest_gap_ns: int = 0
    rank: int = 0
    steps: int = 0
    device: str = ""
    stall_fraction: Num = 0
    recurring_fraction: Num = 0
    step_fractions: list[Num] = msgspec.field(default_factory=list)
    data_load_sources: list[str] = msgspec.field(default_factory=list)
    stall_labels: dict[str, int] = msgspec.field(default_factory=dict)

class HostStallsSection(Struct):
    """Section `host_stalls` (tracekit/analyze: the analyzer of that name; its module docstring defines it)."""

    ranks: list[HostStallsRanksRow] = msgspec.field(default_factory=list)
    thresholds: dict[str, Any] = msgspec.field(default_factory=dict)

class HostBoundRanksRow(Struct):
    rank: int = 0
    steps: int = 0
    step_ns: int = 0
    host_busy_ns: int = 0
    device_busy_ns: int = 0
    launch_wait_ns: int = 0
    launch_wait_busy_ns: int = 0
    slow_ops_ns: int = 0
    first_launch_ns: int | UnsetType = UNSET
    data_load_ns: int = 0
    host_work_ns: int | UnsetType = UNSET
    slow_ops: int = 0
    wait_in_ops: dict[str, int] | UnsetType = UNSET

class HostBoundSlowOpsRow(Struct):
    name: str = ""
    count: int = 0
    excess_ns: int = 0
    median_ns: int = 0
    longest_ns: int = 0

class HostBoundSection(Struct):
    """Section `host_bound` (tracekit/analyze: the analyzer of that name; its module docstring defines it)."""

    ranks: list[HostBoundRanksRow] = msgspec.field(default_factory=list)
    slow_ops: list[HostBoundSlowOpsRow] = msgspec.field(default_factory=list)
    thresholds: dict[str, Any] = msgspec.field(default_factory=dict)

class ExpertsLayersRow(Struct):
    layer: int = 0
    num_experts: int = 0
    skew: Num | None = None
    skew_max: Num | None = None
    hot_expert: int = 0
    hot_owner_ranks: list[int] = msgspec.field(default_factory=list)
    tokens_total: int = 0
    dropped_total: int = 0
    dropped_fraction: Num = 0
    hot_dropped_fraction: Num = 0

class ExpertsHeatmapRow(Struct):
    step: int = 0
    layer: int = 0
    tokens: list[int] = msgspec.field(default_factory=list)
    dropped: list[int] = msgspec.field(default_factory=list)
    skew: Num | None = None

class ExpertsRanksRow(Struct):
    rank: int = 0
    a2a_ns: Num | None = None
    a2a_calls: Num | None = None
    a2a_recv_elems: Num | None = None
    a2a_bytes: Num | None = None
    tokens_received: Num | None = 0  # null on a rank with all-to-alls and no routing or expert kernels (a log-only rank)
    expert_ns: Num | None = 0

class ExpertsSection(Struct):
    """Section `experts` (tracekit/analyze: the analyzer of that name; its module docstring defines it)."""

    source: str | None = None
    granularity: str | None = None
    layers: list[ExpertsLayersRow] = msgspec.field(default_factory=list)
    heatmap: list[ExpertsHeatmapRow] = msgspec.field(default_factory=list)
    ranks: list[ExpertsRanksRow] = msgspec.field(default_factory=list)

class BandwidthRowsRow(Struct):
    pg_name: str = ""
    dim: str = ""
    op: str = ""
    group_size: int = 0
    bucket_bytes: int = 0
    count: int = 0
    bytes_p50: int = 0
    time_ns_p50: int = 0
    algbw_gbps_p50: Num = 0
    busbw_gbps_p50: Num | None = None
    busbw_gbps_p75: Num | None = None
    busbw_gbps_max: Num | None = None
    time_ns_per_step: Num = 0
    reference_gbps: Num | None = None
    reference: str | None = None
    low: bool = False
    lost_ns_per_step: Num = 0
    links: list[dict[str, Any]] | UnsetType = UNSET
    """sendrecv rows only: [{src, dst, count, busbw_gbps_p50}]"""

class BandwidthUnsizedRow(Struct):
    pg_name: str = ""
    op: str = ""
    count: int = 0
    reason: str = ""

class BandwidthSection(Struct):
    """Section `bandwidth` (tracekit/analyze: the analyzer of that name; its module docstring defines it)."""

    time_basis: str = ""
    rows: list[BandwidthRowsRow] = msgspec.field(default_factory=list)
    unsized: list[BandwidthUnsizedRow] = msgspec.field(default_factory=list)

class ThroughputRanksRow(Struct):
    rank: int = 0
    device: str | None = None
    steps: int = 0
    step_ns_mean: Num | None = None
    tokens_per_s: Num | None = None
    flops_per_step: Num | None = None
    achieved_tflops: Num | None = None
    peak_tflops: Num | None = None
    peak_source: str | None = None
    mfu: Num | None = None

class ThroughputSection(Struct):
    """Section `throughput` (tracekit/analyze: the analyzer of that name; its module docstring defines it)."""

    tokens_per_step: int | None = None
    tokens_source: str | None = None
    dp_degree: int | None = None
    steps: int = 0
    step_ns_mean: Num | None = None
    tokens_per_s: Num | None = None
    tokens_per_s_per_device: Num | None = None
    world_size: int = 0
    ranks: list[ThroughputRanksRow] = msgspec.field(default_factory=list)

class OpsRanksRow(Struct):
    rank: int = 0
    device: str | None = None
    device_match: str | None = None
    peak_dtype: str | None = None
    peak_tflops: Num | None = None
    hbm_tbps: Num | None = None
    peak_source: str | None = None
    steps: int = 0
    step_ns: int | None = None
    time_basis: str = ""
    model_flops: int | None = None
    flops_per_step: Num | None = None
    achieved_tflops: Num | None = None
    mfu: Num | None = None
    hardware_flops: int | None | UnsetType = UNSET
    recompute_flops: int | UnsetType = UNSET
    recompute_ops: int | UnsetType = UNSET
    hardware_tflops: Num | None | UnsetType = UNSET
    hfu: Num | None | UnsetType = UNSET
    kernel_ns: int = 0
    op_kernel_ns: int = 0
    flops_coverage: Num | None = None

class OpsCategoriesRow(Struct):
    category: str = ""
    kernel_ns: int = 0
    share: Num | None = None
    ops: int = 0
    flops: int = 0

class OpsTopOpsRow(Struct):
    name: str = ""
    category: str = ""
    dtype: str | None = None
    input_dims: str | None = None
    gemm: list[int] | None = None
    formula: str | None = None
    count: int = 0
    kernel_ns: int = 0
    ranks: list[int] = msgspec.field(default_factory=list)
    share: Num | None = None
    flops: int | None = None
    bytes: int | None = None
    peak_tflops: Num | None = None
    tflops: Num | None = None
    tbps: Num | None = None
    intensity: Num | None = None
    roof_tflops: Num | None = None
    bound: str | None = None
    pct_of_roof: Num | None = None

class OpsGemm(Struct):
    shapes: int = 0
    count: int = 0
    kernel_ns: int = 0
    flops: int = 0
    tflops: Num | None = None

class OpsKernelsRow(Struct):
    name: str | None = None
    category: str | None = None
    kind: str | None = None
    count: int = 0
    total_ns: int = 0
    max_ns: int = 0
    streams: list[int] = msgspec.field(default_factory=list)
    mean_ns: Num | None = None
    share: Num | None = None

class OpsRooflinePointsRow(Struct):
    name: str = ""
    category: str = ""
    intensity: Num = 0
    tflops: Num | None = None
    kernel_ns: int = 0

class OpsRoofline(Struct):
    peak_tflops: Num = 0
    hbm_tbps: Num = 0
    ridge: Num = 0
    dtype: str | None = None
    device: str | None = None
    points: list[OpsRooflinePointsRow] = msgspec.field(default_factory=list)

class OpsSection(Struct):
    """Section `ops` (tracekit/analyze: the analyzer of that name; its module docstring defines it)."""

    available: bool = False
    reason: str | None = None
    top_n: int = 0
    ranks: list[OpsRanksRow] = msgspec.field(default_factory=list)
    categories: list[OpsCategoriesRow] = msgspec.field(default_factory=list)
    top_ops: list[OpsTopOpsRow] = msgspec.field(default_factory=list)
    gemm: OpsGemm = msgspec.field(default_factory=OpsGemm)
    kernels: list[OpsKernelsRow] = msgspec.field(default_factory=list)
    roofline: OpsRoofline | None = None
    worst: list[OpsTopOpsRow] = msgspec.field(default_factory=list)
    notes: list[str] = msgspec.field(default_factory=list)

class PlacementGroupsRow(Struct):
    pg_name: str = ""
    dim: str = ""
    ranks: list[int] = msgspec.field(default_factory=list)
    hosts: list[str] = msgspec.field(default_factory=list)
    crosses_hosts: bool = False
    heavy: bool = False
    exposed_ns_per_step: Num | None = None
    exposed_basis: str | None = None

class PlacementSection(Struct):
    """Section `placement` (tracekit/analyze: the analyzer of that name; its module docstring defines it)."""

    hosts: dict[str, str] = msgspec.field(default_factory=dict)
    host_source: str | None = None
    num_hosts: int = 0
    groups: list[PlacementGroupsRow] = msgspec.field(default_factory=list)

class MemoryRanksRowAtPeak(Struct):
    label: str | None = None
    op: str | None = None
    phase: str | None = None
    microbatch: int | None = None
    layer: int | None = None
    stage: int | None = None

class MemoryRanksRowStepsRow(Struct):
    step: int = 0
    base: int = 0
    peak: int = 0

class MemoryRanksRowStaticEstimate(Struct):
    grad_bytes: int | None = None
    param_bytes: int | None = None
    optimizer: str | None = None
    optimizer_state_bytes: int | None = None

class MemoryRanksRowSplit(Struct):
    static_bytes: int | None = None
    activation_bytes: int = 0
    static_source: str = ""

class MemoryRanksRow(Struct):
    rank: int = 0
    device_type: int = 0
    device: int = 0
    peak_allocated: int = 0
    peak_reserved: int = 0
    peak_ts: int = 0
    peak_step: int | None = None
    at_peak: MemoryRanksRowAtPeak = msgspec.field(default_factory=MemoryRanksRowAtPeak)
    static_bytes: int | None = None
    activation_peak_bytes: int = 0
    activation_held_bytes: int = 0
    per_microbatch_bytes: int | None = None
    in_flight_measured: Num | None = None
    steps: list[MemoryRanksRowStepsRow] = msgspec.field(default_factory=list)
    static_estimate: MemoryRanksRowStaticEstimate = msgspec.field(default_factory=MemoryRanksRowStaticEstimate)
    timeline: dict[str, list[int]] = msgspec.field(default_factory=dict)
    split: MemoryRanksRowSplit = msgspec.field(default_factory=MemoryRanksRowSplit)

class MemoryStagesRow(Struct):
    stage: int = 0
    ranks: list[int] = msgspec.field(default_factory=list)
    activation_peak_bytes: int = 0
    activation_held_bytes: int = 0
    per_microbatch_bytes: int | None = None
    in_flight_measured: Num = 0
    in_flight_schedule: int = 0
    peak_allocated: int = 0
    layers: int | None = None

class MemoryRecomputeRow(Struct):
    rank: int = 0
    recompute_ns_per_step: int = 0
    ops_per_step: Num = 0
    names: list[str] = msgspec.field(default_factory=list)

class MemorySection(Struct):
    """Section `memory` (tracekit/analyze: the analyzer of that name; its module docstring defines it)."""

    available: bool = False
    reason: str | None = None
    counter: str | None = None
    ranks_without_memory_events: list[int] = msgspec.field(default_factory=list)
    ranks: list[MemoryRanksRow] = msgspec.field(default_factory=list)
    stages: list[MemoryStagesRow] = msgspec.field(default_factory=list)
    recompute: list[MemoryRecomputeRow] = msgspec.field(default_factory=list)

class AdviceSection(Struct):
    """Section `advice` (tracekit/analyze: the analyzer of that name; its module docstring defines it)."""

    available: bool = False
    reason: str | None = None
    advice: dict[str, Any] | None = None

class RecommendationsRecommendationsRow(Struct):
    kind: str = ""
    severity: str = ""
    ranks: list[int] = msgspec.field(default_factory=list)
    dim: str | None = None
    summary: str = ""
    recommendation: str = ""
    est_saving_ns: int = 0
    saving_formula: str = ""
    explained_by: str | None = None

class RecommendationsSection(Struct):
    """Section `recommendations` (tracekit/analyze: the analyzer of that name; its module docstring defines it)."""

    recommendations: list[RecommendationsRecommendationsRow] = msgspec.field(default_factory=list)

class CriticalPathStepsRowComposition(Struct):
    step_ns: int = 0
    by_category: dict[str, int] = msgspec.field(default_factory=dict)
    by_rank: dict[str, int] = msgspec.field(default_factory=dict)
    by_dim: dict[str, int] = msgspec.field(default_factory=dict)
    by_lane: dict[str, int] = msgspec.field(default_factory=dict)

class CriticalPathStepsRowPathRow(Struct):
    rank: int = 0
    lane: str = ""
    category: str = ""
    name: str = ""
    start_ns: int = 0
    end_ns: int = 0
    ops: int = 0
    dim: str | None = None

class CriticalPathStepsRowTimeline(Struct):
    lanes: list[str] = msgspec.field(default_factory=list)
    intervals: list[list[Any]] = msgspec.field(default_factory=list)
    t0_ns: int = 0
    min_gap_ns: int = 0
    max_intervals: int = 0
    truncated_ranks: list[Any] = msgspec.field(default_factory=list)

class CriticalPathStepsRow(Struct):
    step: int | None = 0
    measured_ns: int = 0
    replayed_ns: int = 0
    replay_error: Num = 0
    nodes: int = 0
    edges: int = 0
    slowest_rank: int = 0
    composition: CriticalPathStepsRowComposition = msgspec.field(default_factory=CriticalPathStepsRowComposition)
    path: list[CriticalPathStepsRowPathRow] = msgspec.field(default_factory=list)
    timeline: CriticalPathStepsRowTimeline | UnsetType = UNSET

class CriticalPathWhatifRow(Struct):
    finding: int = 0
    kind: str = ""
    fix: str = ""
    step_ns: int = 0
    saving_ns: int = 0
    counted: bool = False

class CriticalPathAllFixes(Struct):
    fixes: list[str] = msgspec.field(default_factory=list)
    step_ns: int = 0
    saving_ns: int = 0

class CriticalPathVerdictHostCause(Struct):
    finding: int | None = None
    kind: str | None = None
    saving_ns: int | None = None
    text: str = ""

class CriticalPathVerdict(Struct):
    bound: str = ""
    lane_shares: dict[str, Num] = msgspec.field(default_factory=dict)
    path_ranks: list[int] = msgspec.field(default_factory=list)
    tie_with: str | None | UnsetType = UNSET
    text: str = ""
    host_cause: CriticalPathVerdictHostCause | UnsetType = UNSET

class CriticalPathSection(Struct):
    """Section `critical_path` (tracekit/analyze: the analyzer of that name; its module docstring defines it)."""

    steps: list[CriticalPathStepsRow] = msgspec.field(default_factory=list)
    whatif: list[CriticalPathWhatifRow] = msgspec.field(default_factory=list)
    all_fixes: CriticalPathAllFixes | None = None
    verdict: CriticalPathVerdict | None = None
    measured_step_ns: int | None = None
    skipped: str | None = None
    step_rule: str | UnsetType = UNSET

class HangDumps(Struct):
    ranks: list[int] = msgspec.field(default_factory=list)
    empty: list[int] = msgspec.field(default_factory=list)
    dead: list[int] = msgspec.field(default_factory=list)
    no_dump: list[int] = msgspec.field(default_factory=list)
    files: dict[str, str | None] | UnsetType = UNSET


class HangWaitsRow(Struct):
    rank: int = 0
    waits_for: list[int] = msgspec.field(default_factory=list)


class HangSection(Struct):
    """Section `hang`: hang post-mortem of Flight Recorder dumps / tracekit hang dumps (analyze/hang.py).
    The nested group, P2P, last-entered and root-cause records stay dicts (see that module)."""

    hung: bool = False
    dumps: HangDumps = msgspec.field(default_factory=HangDumps)
    groups: list[dict[str, Any]] = msgspec.field(default_factory=list)
    p2p_unmatched: list[dict[str, Any]] = msgspec.field(default_factory=list)
    last_entered: list[dict[str, Any]] = msgspec.field(default_factory=list)
    waits: list[HangWaitsRow] = msgspec.field(default_factory=list)
    root_causes: list[dict[str, Any]] = msgspec.field(default_factory=list)


class Sections(Struct, omit_defaults=True):
    """The sections of the analyzers that ran and have one, in this order (flow.py `document_order`: the report's
    reading order, whatever order the engine ran them in)."""

    inputs: InputsSection | None = None
    hang: HangSection | None = None
    layout: LayoutSection | None = None
    matching: MatchingSection | None = None
    clocks: ClocksSection | None = None
    breakdown: BreakdownSection | None = None
    recording: RecordingSection | None = None
    trace_kind: TraceKindSection | None = None
    stragglers: StragglersSection | None = None
    unoverlapped: UnoverlappedSection | None = None
    pipeline: PipelineSection | None = None
    host_stalls: HostStallsSection | None = None
    host_bound: HostBoundSection | None = None
    experts: ExpertsSection | None = None
    bandwidth: BandwidthSection | None = None
    throughput: ThroughputSection | None = None
    ops: OpsSection | None = None
    placement: PlacementSection | None = None
    memory: MemorySection | None = None
    advice: AdviceSection | None = None
    recommendations: RecommendationsSection | None = None
    critical_path: CriticalPathSection | None = None


SECTION_NAMES: tuple[str, ...] = Sections.__struct_fields__


class SkippedInput(Struct):
    file: str = ""
    reason: str = ""
    duplicate_of: str | UnsetType = UNSET
    """the file kept for the same rank, which holds every event of this one (nothing lost)"""


class DocumentInputs(Struct):
    ranks: list[int] = msgspec.field(default_factory=list)
    skipped: list[SkippedInput] = msgspec.field(default_factory=list)
    warnings: list[str] | UnsetType = UNSET


class FindingDoc(Struct):
    """A finding as analysis.json holds it (tracekit/findings/finding.py: Finding.to_json)."""

    kind: str = ""
    severity: str = ""
    summary: str = ""
    ranks: list[int] = msgspec.field(default_factory=list)
    dim: str | None = None
    evidence: dict[str, Any] = msgspec.field(default_factory=dict)
    recommendation: str = ""
    est_saving_ns: int = 0

    @property
    def about_analysis(self) -> bool:
        """A finding about the analysis itself (its inputs, how far its verdict holds), not about the run
        (tracekit/findings/finding.py ANALYSIS_KINDS): reports show it as a caveat beside the verdict."""
        return self.kind in ANALYSIS_KIND_NAMES


class AnalyzerError(Struct):
    analyzer: str = ""
    error: str = ""


class AnalysisDocument(Struct):
    """tracekit analysis.json (schema tracekit.analysis/1)."""

    schema: str = ANALYSIS_SCHEMA
    tracekit_version: str = ""
    command: str | None = None
    inputs: DocumentInputs = msgspec.field(default_factory=DocumentInputs)
    ranks: list[RankBreakdown] = msgspec.field(default_factory=list)
    findings: list[FindingDoc] = msgspec.field(default_factory=list)
    sections: Sections = msgspec.field(default_factory=Sections)
    analyzer_errors: list[AnalyzerError] = msgspec.field(default_factory=list)
