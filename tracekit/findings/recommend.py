"""The one place for recommendation rules: finding facts in, concrete advice plus an estimated saving out.

Every analyzer calls the `advise_*` helper for its finding kind, so the wording and the saving formulas
live here. Each saving is an upper bound on step time saved per step (DESIGN §3) and its formula goes into
the finding's evidence as `saving_formula` (with the numbers used). The `recommendations`
analyzer (reconcile.py) then marks symptoms whose cause another finding names, and the critical
path replaces each bound by the replayed saving of the finding's fix.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Sequence


BACKWARD_FACTOR = 3.0
"""Forward + backward time ≈ 3 × forward time (backward ≈ 2 × forward), for forward-only labels."""
TARGET_BUBBLE = 0.2
"""Micro-batch advice aims at a theoretical bubble at or below this fraction."""


@dataclass(frozen=True)
class Remedy:
    text: str
    saving_ns: float
    evidence: dict[str, Any] = field(default_factory=dict)


def _bubble(p: int, m: int, v: int) -> float:
    return (p - 1) / (v * m + p - 1)


def advise_bubble(*, p: int, m: int, v: int, schedule: str | None, measured_bubble: float, window_ns: float,
                  stage_compute_ns: Sequence[float] | None = None, max_microbatches: int | None = None) -> Remedy:
    """More micro-batches (or an interleaved schedule) when the theoretical bubble exceeds TARGET_BUBBLE.

    m' = the smallest micro-batch count whose theoretical bubble is ≤ TARGET_BUBBLE (capped by the batch;
    at the cap, interleave 2 chunks per rank). Saving, non-interleaved with per-stage compute c_s per
    step: the pipeline model window(m) = ((m−1)·c_max + Σc)/m gives window(m) − window(m') =
    (Σc − c_max)·(1/m − 1/m') — total compute stays, only fill and drain shrink; idle time the model
    does not explain (p2p latency, contention) is not claimed. Otherwise window·(1 − (1−b)/(1−b')).
    Upper bound either way: per-micro-batch overheads of smaller micro-batches are ignored.
    """
    b_now = _bubble(p, m, v) if p > 1 else 0.0
    if p < 2 or b_now <= TARGET_BUBBLE:
        return Remedy(text="", saving_ns=0.0, evidence={
            "saving_formula": f"none: theoretical bubble {b_now:.0%} is within the {TARGET_BUBBLE:.0%} target"})
    need = math.ceil((p - 1) * (1 - TARGET_BUBBLE) / (TARGET_BUBBLE * v))
    m_new = need if max_microbatches is None else min(need, max_microbatches)
    v_new, sched_new = v, schedule
    if m_new <= m:
        m_new = m
        if v > 1:
            return Remedy(text="", saving_ns=0.0, evidence={
                "saving_formula": "none: micro-batch count is at the batch limit and the schedule interleaved"})
        v_new, sched_new = 2, "interleaved"
    b_pred = _bubble(p, m_new, v_new)
    if stage_compute_ns and len(stage_compute_ns) == p and v == v_new == 1:
        c = [float(x) for x in stage_compute_ns]
        saving = max(0.0, (sum(c) - max(c)) * (1 / m - 1 / m_new))
        formula = (f"(Σc−c_max)·(1/m−1/m') = ({sum(c):.0f}−{max(c):.0f})·(1/{m}−1/{m_new}); "
                   "c = stage compute per step")
    else:
        saving = max(0.0, window_ns * (1.0 - (1.0 - measured_bubble) / (1.0 - b_pred)))
        formula = (f"window·(1−(1−b)/(1−b')) = {window_ns:.0f}·(1−(1−{measured_bubble:.4f})/(1−{b_pred:.4f}))"
                   f", b'=(p−1)/(v·m'+p−1) with p={p}, m'={m_new}, v={v_new}")
    parts = []
    if m_new != m:
        parts.append(f"raise the micro-batch count from {m} to {m_new} (same global batch)")
    if v_new != v:
        parts.append(f"use an interleaved schedule with {v_new} model chunks per rank")
    text = (" and ".join(parts) + f": theoretical bubble {b_now:.0%} → {b_pred:.0%} (measured now "
            f"{measured_bubble:.0%}); if micro-batches get too small to keep the device busy, raise the "
            "global batch instead")
    text = text[0].upper() + text[1:]
    return Remedy(text=text, saving_ns=saving, evidence={
        "recommended_microbatches": m_new, "recommended_chunks_per_rank": v_new,
        "recommended_schedule": sched_new, "predicted_bubble": b_pred, "saving_formula": formula})


def best_contiguous_split(layer_costs: Sequence[float], parts: int) -> list[int]:
    """Layers per stage that minimise the slowest stage, keeping layer order (exact, by DP over cuts)."""
    n = len(layer_costs)
    if parts < 1 or parts > n:
        raise ValueError(f"cannot split {n} layers into {parts} stages")
    pre = [0.0]
    for c in layer_costs:
        pre.append(pre[-1] + c)
    inf = float("inf")
    best = [[inf] * (n + 1) for _ in range(parts + 1)]
    cut = [[0] * (n + 1) for _ in range(parts + 1)]
    best[0][0] = 0.0
    for k in range(1, parts + 1):
        for i in range(k, n + 1):
            for j in range(k - 1, i):
                val = max(best[k - 1][j], pre[i] - pre[j])
                if val < best[k][i]:
                    best[k][i], cut[k][i] = val, j
    sizes, i = [], n
    for k in range(parts, 0, -1):
        j = cut[k][i]
        sizes.append(i - j)
        i = j
    return sizes[::-1]


def fit_layer_cost(stage_compute_ns: Sequence[float], stage_layers: Sequence[int]) -> tuple[float, float] | None:
    """Least-squares c_s = fixed + per_layer·n_s over the stages; None when layer counts do not vary."""
    n = [float(x) for x in stage_layers]
    c = [float(x) for x in stage_compute_ns]
    nm, cm = sum(n) / len(n), sum(c) / len(c)
    var = sum((x - nm) ** 2 for x in n)
    if var == 0:
        return None
    per_layer = sum((x - nm) * (y - cm) for x, y in zip(n, c)) / var
    return cm - per_layer * nm, per_layer


def advise_imbalance(*, stage_compute_ns: Sequence[float], stage_layers: Sequence[int] | None,
                     num_microbatches: int) -> Remedy:
    """A layer re-split for unequal stages.

    Step time ≈ (m−1)/m·max_s c_s + Σ_s c_s/m (c_s: a stage's compute per step), so levelling stages
    saves (m−1)/m·(c_max − c'_max). Stage cost model c_s = fixed + per_layer·layers_s, fitted over the
    stages (fixed = embedding/head/schedule work per stage); c'_max comes from the most even re-split
    under that model. Upper bound: all stages at the mean (c'_max = mean c).
    """
    m = num_microbatches
    c = [float(x) for x in stage_compute_ns]
    cmax, cmean = max(c), sum(c) / len(c)
    bound = (m - 1) / m * (cmax - cmean)
    ev: dict[str, Any] = {"saving_upper_bound_ns": int(bound)}
    slow = c.index(cmax)
    fit = fit_layer_cost(c, stage_layers) if stage_layers and len(stage_layers) == len(c) else None
    if fit is not None and fit[1] > 0:
        fixed, per_layer = fit
        new = best_contiguous_split([per_layer] * int(sum(stage_layers)), len(c))
        new_cost = [fixed + per_layer * n for n in new]
        saving = max(0.0, min(bound, (m - 1) / m * (cmax - max(new_cost))))
        ev.update({"recommended_stage_layers": new, "predicted_stage_compute_ns": [int(x) for x in new_cost],
                   "fixed_ns_per_stage": int(fixed), "per_layer_ns": int(per_layer),
                   "saving_formula": (f"(m−1)/m·(c_max−c'_max) = ({m}−1)/{m}·({cmax:.0f}−{max(new_cost):.0f}), "
                                      f"c' = {fixed:.0f} + {per_layer:.0f}·layers; upper bound (all stages at "
                                      f"the mean) {bound:.0f}")})
        if list(new) == list(stage_layers) or max(new_cost) >= cmax:
            return Remedy(text="", saving_ns=0.0, evidence=ev)
        old_pre, pre = [0], [0]
        for a, b in zip(stage_layers, new):
            old_pre.append(old_pre[-1] + a)
            pre.append(pre[-1] + b)
        moves = []
        for s in range(len(c) - 1):  # boundary between stage s and s+1 moves from old_pre[s+1] to pre[s+1]
            a, b = old_pre[s + 1], pre[s + 1]
            if b < a:
                moves.append(f"layer{'s' if a - b > 1 else ''} {_span(b, a)} from stage {s} to stage {s + 1}")
            elif b > a:
                moves.append(f"layer{'s' if b - a > 1 else ''} {_span(a, b)} from stage {s + 1} to stage {s}")
        text = (f"Re-split the layers over the stages: move {', '.join(moves)} "
                f"(layers per stage {','.join(map(str, stage_layers))} → {','.join(map(str, new))}); "
                f"predicted slowest stage {max(new_cost) / 1e6:.1f} ms instead of {cmax / 1e6:.1f} ms per step")
        return Remedy(text=text, saving_ns=saving, evidence=ev)
    ev["saving_formula"] = f"(m−1)/m·(c_max−c_mean) = ({m}−1)/{m}·({cmax:.0f}−{cmean:.0f})"
    text = (f"Stage {slow} is the slowest: move work off it to the faster stages so every stage computes "
            f"about {cmean / 1e6:.1f} ms per step")
    return Remedy(text=text, saving_ns=bound, evidence=ev)


def _span(a: int, b: int) -> str:
    """Layers a..b−1 as text."""
    return str(a) if b - a == 1 else f"{a}–{b - 1}"


def advise_routing_skew(*, layer: int, expert: int, skew: float, hot_rank_expert_ns: float | None,
                        mean_rank_expert_ns: float | None, aux_loss_weight: float | None,
                        capacity_factor: float | None, dropped_fraction: float | None,
                        forward_only: bool = True, hot_rank_a2a_ns: float | None = None,
                        recv_mean_over_max: float | None = None, hot_label: str | None = None) -> Remedy:
    """Load balancing for a hot expert.

    Every rank waits for the hottest expert-parallel rank at the combine all-to-all, so balanced routing
    saves up to (hot − mean) expert-compute time per step (×3 when only forward time is labelled), plus
    the all-to-all time of the rank receiving the most tokens scaled down to the mean load:
    a2a_hot·(1 − mean/max tokens received).
    """
    factor = BACKWARD_FACTOR if forward_only else 1.0
    ev: dict[str, Any] = {}
    if hot_rank_expert_ns is not None and mean_rank_expert_ns is not None:
        compute = max(0.0, factor * (hot_rank_expert_ns - mean_rank_expert_ns))
        formula = (f"{factor:g}·(hot − mean expert time per rank) = {factor:g}·"
                   f"({hot_rank_expert_ns:.0f}−{mean_rank_expert_ns:.0f})")
    else:
        compute, formula = 0.0, "no expert compute time (ep:experts labels)"
    a2a = 0.0
    if hot_rank_a2a_ns is not None and recv_mean_over_max is not None:
        a2a = max(0.0, hot_rank_a2a_ns * (1.0 - recv_mean_over_max))
        formula += (f" + a2a_hot·(1 − mean/max received) = {hot_rank_a2a_ns:.0f}·(1−{recv_mean_over_max:.3f})")
    saving = compute + a2a
    ev["saving_formula"] = formula
    w = f" (now {aux_loss_weight:g})" if aux_loss_weight is not None else ""
    cf = f" (now {capacity_factor:g})" if capacity_factor is not None else ""
    new_w = f" to about {aux_loss_weight * 10:g}" if aux_loss_weight else ""
    hot = hot_label or f"Expert {expert}"  # a rank's experts where the trace does not show which one is hot
    verb = "receives" if hot_label is None else "receive"
    text = (f"{hot} of MoE layer {layer} {verb} {skew:.1f}x the mean tokens: raise the load-balancing "
            f"aux-loss weight{w}{new_w}, check the router's bias/initialisation, or lower the capacity "
            f"factor{cf} to cap the hot expert")
    if dropped_fraction:
        text += f" (already {dropped_fraction:.0%} of its tokens are dropped)"
    ev["recommended_aux_loss_weight"] = aux_loss_weight * 10 if aux_loss_weight else None
    return Remedy(text=text, saving_ns=saving, evidence=ev)


_COMM_ADVICE = {
    "dp": ("Overlap the gradient all-reduce with backward: let DDP reduce buckets during backward "
           "(no post-backward sync), tune bucket_cap_mb (smaller buckets start earlier, larger ones "
           "cost fewer calls), or accumulate gradients over more micro-steps"),
    "fsdp": ("Prefetch FSDP all-gathers (forward/backward prefetch, reshard_after_forward=False for the "
             "last blocks) and keep reduce-scatters asynchronous so they hide behind compute"),
    "tp": ("Tensor-parallel communication is on the critical path: lower the TP degree, keep each TP "
           "group inside one host (fast links), or overlap it (async TP / sequence parallel)"),
    "cp": ("Overlap the ring exchange with the attention of the previous block (double-buffer the K/V "
           "ring), or lower the context-parallel degree"),
    "ep": ("Overlap the expert all-to-all with shared-expert/dense compute, keep EP groups inside a host, "
           "or lower the EP degree"),
    "pp": "Use non-blocking sends/receives so stage-to-stage transfers hide behind the next micro-batch",
}


LATENCY_BOUND_BYTES = 1 << 20
"""Below about 1 MiB a collective's time is mostly per-call latency (NCCL-tests' bus bandwidth curves
only flatten above it): fewer, larger messages are the lever, not fewer bytes."""
ASYNC_OVERLAP = 0.10
"""A share of its time overlapped with compute at which a collective is already issued asynchronously."""
SP_ACTIVATION_OPS = ("all_gather", "reduce_scatter")


def advise_collective(*, dim: str | None, op: str | None, overlap_ratio: float | None,
                      bytes_p50: float | None, calls_per_step: float | None = None) -> str:
    """The remedy that fits what the evidence shows about a collective: already asynchronous (DDP/FSDP overlap
    part of it), latency-bound (small messages), or sequence-parallel activations (tp all-gather /
    reduce-scatter: not gradients), else the dim's general advice."""
    parts = []
    size = None
    if bytes_p50:
        size = (f"{bytes_p50:.0f} B" if bytes_p50 < 1024 else f"{bytes_p50 / 1024:.0f} KiB" if bytes_p50 < (1 << 20)
                else f"{bytes_p50 / (1 << 20):.1f} MiB")
    latency_bound = bytes_p50 is not None and 0 < bytes_p50 < LATENCY_BOUND_BYTES
    if dim == "tp" and op in SP_ACTIVATION_OPS:
        parts.append(f"These tp {op}s move sequence-parallel activations in forward and backward, not gradients: "
                     "overlap them with the neighbouring matmuls (async TP / collective matmul) or keep the tp group "
                     "on the fastest links (one host); bucketing or lower-precision gradients do not apply")
    elif dim in ("dp", "fsdp") and overlap_ratio is not None and overlap_ratio >= ASYNC_OVERLAP:
        parts.append(f"{'DDP' if dim == 'dp' else 'FSDP'} already issues these asynchronously ({overlap_ratio:.0%} "
                     "of their time overlaps compute); the exposed part is what is left after the last gradients "
                     "are ready")
        parts.append("fewer, larger buckets (raise bucket_cap_mb) cut the per-call latency" if latency_bound else
                     "move fewer bytes (bf16 gradient reduction, gradient accumulation over more micro-steps) or "
                     "faster links")
    elif latency_bound:
        parts.append(f"Each {op or 'collective'} moves only {size} (latency-bound): send fewer, larger messages "
                     "(coalesce the calls, larger buckets); fewer bytes or a smaller degree would barely help")
    else:
        parts.append(_COMM_ADVICE.get(dim or "", "Overlap this communication with compute or make it smaller"))
    if latency_bound and size and size not in parts[0] and dim not in ("tp",):
        parts[-1] += f" (median message {size}{f', {calls_per_step:.0f} calls per step' if calls_per_step else ''})"
    return "; ".join(parts) + "."


def advise_placement(*, dim: str, group_ranks: Sequence[int], hosts: Sequence[str], exposed_ns: float,
                     light_dims_inside: Sequence[str], displaced: Sequence[str] = ()) -> Remedy:
    """Remap ranks so a communication-heavy group stays inside one host; with `displaced` (heavy dims inside a
    host now that would no longer fit beside it) a trade whose saving the trace cannot price: none claimed."""
    if displaced:
        other = "/".join(displaced)
        text = (f"The {dim.upper()} group {list(group_ranks)} spans hosts {', '.join(hosts)}, but a host is full "
                f"with {other} groups: putting {dim} inside a host would push {other} across hosts. Compare the "
                f"two dims' traffic (or try a smaller {other} degree) before remapping; no saving is claimed")
        return Remedy(text=text, saving_ns=0.0, evidence={
            "saving_formula": f"0: a trade with {other} traffic the trace cannot price "
                              f"(exposed {dim} time per step = {exposed_ns:.0f})"})
    swap = (f" and let {'/'.join(light_dims_inside)} (light traffic) span the hosts instead"
            if light_dims_inside else "")
    text = (f"The {dim.upper()} group {list(group_ranks)} spans hosts {', '.join(hosts)}: order the device mesh "
            f"so {dim} is the innermost dimension (its ranks consecutive on one host){swap}")
    return Remedy(text=text, saving_ns=max(0.0, float(exposed_ns)), evidence={
        "saving_formula": f"exposed time of the group's collectives per step = {exposed_ns:.0f} (upper bound)"})


def advise_bandwidth(*, group: str, dim: str | None, busbw_gbps: float, reference_gbps: float,
                     reference: str, lost_ns: float, exposed_bound_ns: float | None = None) -> Remedy:
    """The remedy for a group whose collectives are slower than the run (or the user's peak) shows possible.
    The saving is the time lost against the reference, at most the exposed transfer time when known."""
    text = (f"Collectives of group {group} ({dim or 'unknown dim'}) reach {busbw_gbps:.2f} GB/s bus bandwidth vs "
            f"{reference_gbps:.2f} GB/s ({reference}): check that group's links/NIC, its transport "
            "(NCCL_IB/NCCL_NET settings, GPUDirect), and that it does not cross a slower host boundary")
    formula = f"Σ(time − bus bytes/reference bandwidth) per step = {lost_ns:.0f}"
    saving = float(lost_ns)
    if exposed_bound_ns is not None:
        saving = min(saving, float(exposed_bound_ns))
        formula = f"min({formula}, exposed transfer time per step = {exposed_bound_ns:.0f})"
    return Remedy(text=text, saving_ns=max(0.0, saving), evidence={"saving_formula": formula})
