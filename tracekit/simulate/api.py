"""simulate(...) → SimResult: per-rank op timelines and the answer key; step_time(...) is the fast path."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from tracekit.layout import ParallelLayout
from tracekit.process_env import gc_paused
from tracekit.simulate import executor
from tracekit.simulate.executor import COLL, MEMORY, Op
from tracekit.simulate.key import KeyStream, RankIntervals, answer_key, answer_key_streamed
from tracekit.simulate.program import World, build_programs, make_world, program_feed
from tracekit.simulate.specs import ClusterSpec, Faults, ModelSpec

T0_NS = 1_764_000_000_000_000_000  # 2025-11-24, epoch ns: the first host op of rank 0
GROUND_TRUTH_SCHEMA = "tracekit.ground_truth/1"


@dataclass
class SimResult:
    model: ModelSpec
    cluster: ClusterSpec
    layout: ParallelLayout
    faults: Faults
    steps: int
    seed: int
    world: World
    programs: list[list[Op]]
    key: dict[str, Any] = field(default_factory=dict)
    faults_truth: list[dict[str, Any]] = field(default_factory=list)
    first_step: int = 1
    peak_memory_bytes: list[int] | None = None
    """per rank, once `prune` dropped the ops it was read from"""
    pruned: frozenset[int] = frozenset()
    """ranks whose programs hold their collective ops only (`prune`: a partial recording writes their log), or
    none (a streamed partial run: their logs are written already)"""
    logs_written: bool = False
    """every rank's comms log was written while simulating (`simulate(logs_dir=...)`)"""

    @property
    def ranks(self) -> int:
        return len(self.programs)

    @property
    def mean_step_ns(self) -> int:
        return self.key["mean_step_ns"]

    def intervals(self, rank: int) -> RankIntervals:
        if rank in self.pruned:
            raise ValueError(f"rank {rank}'s program was pruned to its collectives (a log-only rank)")
        return RankIntervals(self.programs[rank])

    def peak_memory(self, rank: int) -> int:
        if self.peak_memory_bytes is not None:
            return self.peak_memory_bytes[rank]
        return _peak_memory(self.programs[rank])

    def prune(self, keep: set[int] | frozenset[int]) -> None:
        """Drop every op but the collectives from the programs of the ranks not in `keep` (what a log-only
        rank of a partial recording writes is its collective log): the answer key and the memory peaks are
        read before. At 10,000 ranks the programs are most of the simulator's memory."""
        if self.peak_memory_bytes is None:
            self.peak_memory_bytes = [_peak_memory(p) for p in self.programs]
        drop = [r for r in range(self.ranks) if r not in keep and r not in self.pruned]
        for r in drop:
            self.programs[r] = [o for o in self.programs[r] if o.kind == COLL]
        self.pruned = self.pruned | frozenset(drop)

    def ground_truth(self) -> dict[str, Any]:
        return {
            "schema": GROUND_TRUTH_SCHEMA, "producer": "tracekit.simulate",
            "config": config_dict(self), "faults": self.faults_truth, "key": self.key,
            "memory": {"peak_allocated_bytes": {str(r): self.peak_memory(r) for r in range(self.ranks)}},
        }


def _peak_memory(prog: list[Op]) -> int:
    return max((o.extra[1] for o in prog if o.kind == MEMORY), default=0)


def config_dict(res: SimResult) -> dict[str, Any]:
    return {"model": dataclasses.asdict(res.model), "cluster": dataclasses.asdict(res.cluster),
            "layout": layout_truth(res.layout), "faults": res.faults.to_dict(), "steps": res.steps,
            "seed": res.seed, "first_profiler_step": res.first_step}


def layout_truth(layout: ParallelLayout) -> dict[str, Any]:
    """The layout as .ground_truth.json lists it: every field, and `fsdp` / `interleave` as the file spelled
    them before `dp_mode` / `virtual_stages` (keys stay, new ones are added)."""
    return {**dataclasses.asdict(layout), "fsdp": layout.fsdp, "interleave": layout.virtual_stages}


def _run(model, cluster, layout, faults, steps, seed, first_step=1, w: World | None = None
         ) -> tuple[World, list[list[Op]]]:
    w = w or make_world(model, cluster, layout, faults, seed)
    with gc_paused():
        progs = build_programs(w, steps, first_step)
        executor.run(progs, T0_NS)
        executor.finish_colls(progs)
    return w, progs


def _run_streamed(model, cluster, layout, faults, steps, seed, first_step=1, w: World | None = None, *,
                  keep: frozenset[int] = frozenset(), on_coll=None, delays: bool = True
                  ) -> tuple[World, dict[int, list[Op]], KeyStream]:
    """`_run` in bounded memory: each rank's program is built a pipeline action at a time as its host reaches
    the end of it, and its finished ops leave the simulation as they retire (`executor.run(feed, retire)`):
    into the answer key's compact per-rank arrays (`KeyStream`), to `on_coll(rank, op)` for each collective
    (a partial recording's comms log), and kept whole for the ranks in `keep` only. A collective instance
    leaves `World.colls` once all its members retired it. Times equal `_run`'s."""
    w = w or make_world(model, cluster, layout, faults, seed)
    world = w.topo.world
    gens = [program_feed(w, r, steps, first_step) for r in range(world)]
    progs = [next(g) for g in gens]
    kept: dict[int, list[Op]] = {r: [] for r in keep}
    ks = KeyStream(world, delays=delays)
    colls = w.colls

    def feed(r: int) -> bool:
        try:
            next(gens[r])
            return True
        except StopIteration:
            gens[r] = None
            return False

    def retire(r: int, ops: list[Op]) -> None:
        ks.add(r, ops)
        if r in kept:
            kept[r] += ops
        for o in ops:
            if o.kind == COLL:
                if on_coll is not None:
                    on_coll(r, o)
                c = o.coll
                c.retired += 1
                if c.retired == len(c.members):
                    colls.pop(c.key, None)

    with gc_paused():
        executor.run(progs, T0_NS, feed=feed, retire=retire)
    return w, kept, ks


def simulate(model: ModelSpec, cluster: ClusterSpec, layout: ParallelLayout, faults: Faults | None = None, *,
             steps: int = 3, seed: int = 0, without: bool = True, trace_ranks: list[int] | None = None,
             logs_dir=None) -> SimResult:
    """Simulate `steps` training steps; the key holds the exact breakdown and, with `without`, the step time
    with each injected fault removed (re-simulated).

    `trace_ranks` (a partial recording): the programs of the other ranks keep their collectives only once the
    key is read (`SimResult.prune`). The runs without each fault go first, each freed before the next: one
    simulation's memory at a time (at 10,000 ranks two at once did not fit 23 GB).
    With `logs_dir` as well, the run is streamed (`_run_streamed`, bounded memory): every rank's comms log is
    written into `logs_dir` while simulating (`SimResult.logs_written`), only the traced ranks' programs are
    kept, the others' are empty; the runs without each fault are streamed too."""
    faults = faults or Faults()
    w = make_world(model, cluster, layout, faults, seed)
    res = SimResult(model, cluster, layout, faults, steps, seed, w, [])
    res.faults_truth = describe_faults(res)
    streamed = trace_ranks is not None and logs_dir is not None
    if without:
        for f in res.faults_truth:
            m2, l2, f2 = _removed(res, f["kind"])
            f["step_ns_without"] = step_time(m2, cluster, l2, f2, steps=steps, seed=seed, streamed=streamed)
    if streamed:
        from tracekit.simulate.writer import CommLogStreams

        logs = CommLogStreams(res, logs_dir)
        keep = frozenset(trace_ranks)
        _, kept, ks = _run_streamed(model, cluster, layout, faults, steps, seed, w=w, keep=keep, on_coll=logs.add)
        logs.close()
        res.programs = [kept.get(r, []) for r in range(w.topo.world)]
        res.key = answer_key_streamed(ks, steps)
        res.peak_memory_bytes = ks.peak_memory
        res.pruned = frozenset(r for r in range(w.topo.world) if r not in keep)
        res.logs_written = True
        if without:
            for f in res.faults_truth:
                f["step_ns_with"] = res.mean_step_ns
        return res
    _, res.programs = _run(model, cluster, layout, faults, steps, seed, w=w)
    res.key = answer_key(res.programs, w.colls.values(), steps)
    if without:
        for f in res.faults_truth:
            f["step_ns_with"] = res.mean_step_ns
    if trace_ranks is not None:
        res.prune(set(trace_ranks))
    return res


def step_time(model: ModelSpec, cluster: ClusterSpec, layout: ParallelLayout, faults: Faults | None = None, *,
              steps: int = 2, seed: int = 0, streamed: bool = False) -> int:
    """Fast path: mean step time (ns, slowest rank's step window) without writing traces or a full key;
    `streamed`: in bounded memory (`_run_streamed`), the same time."""
    if streamed:
        _, _, ks = _run_streamed(model, cluster, layout, faults or Faults(), steps, seed, delays=False)
        return answer_key_streamed(ks, steps)["mean_step_ns"]
    w, progs = _run(model, cluster, layout, faults or Faults(), steps, seed)
    return answer_key(progs, (), steps)["mean_step_ns"]


@dataclass
class Prediction:
    """What a layout would cost: mean step time (slowest rank's step window) and peak allocated memory."""

    step_ns: int
    peak_memory_bytes: list[int]  # per rank

    @property
    def max_memory_bytes(self) -> int:
        return max(self.peak_memory_bytes)


def predict(model: ModelSpec, cluster: ClusterSpec, layout: ParallelLayout, faults: Faults | None = None, *,
            steps: int = 2, seed: int = 0) -> Prediction:
    """Fast path for the layout advisor / what-if: step time and per-rank peak memory, no traces."""
    w, progs = _run(model, cluster, layout, faults or Faults(), steps, seed)
    step = answer_key(progs, (), steps)["mean_step_ns"]
    mem = [max((o.extra[1] for o in p if o.kind == MEMORY), default=0) for p in progs]
    return Prediction(step, mem)


_FIELD_OF_KIND = {"slow_gpu": "slow_gpu", "slow_link": "slow_link", "slow_nic": "slow_nic",
                  "stage_imbalance": "stage_layers", "router_skew": "router_bias", "host_stall": "host_stall",
                  "slow_data_loading": "slow_data", "uneven_sequence_length": "uneven_seq",
                  "no_overlap": "no_overlap", "groups_span_hosts": "tp_across_hosts"}


def _removed(res: SimResult, kind: str) -> tuple[ModelSpec, ParallelLayout, Faults]:
    if kind == "too_few_microbatches":
        L = res.layout
        m2 = max(L.pp, L.microbatches)
        model = res.model
        per_replica = model.micro_batch_size * L.microbatches
        if m2 != L.microbatches and per_replica % m2 == 0:
            # the same samples per step in more, smaller micro-batches (what a user changes: the global batch
            # and the sequence length stay)
            model = dataclasses.replace(model, micro_batch_size=per_replica // m2)
        elif m2 != L.microbatches:  # fewer samples than micro-batches: same tokens per step, shorter sequences
            model = dataclasses.replace(model, seq=max(1, model.seq * L.microbatches // m2))
        return model, dataclasses.replace(L, microbatches=m2), res.faults
    return res.model, res.layout, res.faults.without(_FIELD_OF_KIND[kind])


def describe_faults(res: SimResult) -> list[dict[str, Any]]:
    """Every active fault with the ranks / dim / stage / expert it affects and the findings that name it."""
    w, f, L, topo = res.world, res.faults, res.layout, res.world.topo
    out: list[dict[str, Any]] = []
    for r, factor in sorted(f.slow_gpu.items()):
        out.append({"kind": "slow_gpu", "ranks": [r], "factor": factor, "expected_findings": ["straggler"],
                    "description": f"GPU of rank {r} runs compute {factor}x slower"})
    for dim, factor in sorted(f.slow_link.items()):
        gs = [list(g.ranks) for g in topo.groups.values() if g.dim in ((dim, "dp_cp") if dim == "dp" else (dim,))]
        out.append({"kind": "slow_link", "dim": dim, "factor": factor, "groups": gs,
                    "ranks": sorted({r for g in gs for r in g}),
                    "expected_findings": ["low_bus_bandwidth", "communication_bound"],
                    "description": f"{dim} links run at 1/{factor} of their bandwidth"})
    for host, factor in sorted(f.slow_nic.items()):
        ranks = [r for r in range(topo.world) if topo.host[r] == host]
        out.append({"kind": "slow_nic", "host": host, "hostname": f"node{host:04d}", "factor": factor,
                    "ranks": ranks, "expected_findings": ["low_bus_bandwidth", "straggler", "communication_bound"],
                    "description": f"inter-host traffic of host {host} runs at 1/{factor} of its bandwidth"})
    if f.stage_layers is not None and len(set(f.stage_layers)) > 1 and L.pp > 1:
        heavy = max(range(len(f.stage_layers)), key=lambda s: f.stage_layers[s])
        out.append({"kind": "stage_imbalance", "dim": "pp", "stage_layers": list(f.stage_layers), "stages": [heavy],
                    "ranks": [r for r in range(topo.world) if topo.coords(r)[0] == heavy % L.pp],
                    "expected_findings": ["pipeline_imbalance"],
                    "description": f"stage {heavy} holds {f.stage_layers[heavy]} of {sum(f.stage_layers)} layers"})
    if f.router_bias and res.model.experts:
        hot = sorted(f.router_bias)
        per = res.model.experts // L.ep
        owners = sorted({r for r in range(topo.world)
                         for g in [topo.group(r, "ep")] if g is None or g.ranks.index(r) in {e // per for e in hot}})
        out.append({"kind": "router_skew", "dim": "ep", "experts": hot,
                    "router_bias": {str(k): v for k, v in sorted(f.router_bias.items())},
                    "layers": [i for i in range(res.model.layers) if res.model.is_moe(i)],
                    "ranks": owners, "expected_findings": ["expert_routing_skew"],
                    "description": "router logits biased toward experts " + ",".join(map(str, hot))})
    if f.host_stall is not None:
        r, ms, every = f.host_stall
        out.append({"kind": "host_stall", "ranks": [r], "stall_ms": ms, "every": every,
                    "expected_findings": ["idle_host_bound", "straggler"],
                    "description": f"rank {r}'s host stalls {ms} ms every {every} step(s)"})
    if f.slow_data is not None:
        r, ms = f.slow_data
        out.append({"kind": "slow_data_loading", "ranks": [r], "ms": ms,
                    "expected_findings": ["idle_host_bound", "straggler"],
                    "description": f"rank {r}'s data loader takes {ms} ms more per step"})
    if f.uneven_seq is not None:
        dp_i, factor = f.uneven_seq
        ranks = [r for r in range(topo.world) if topo.coords(r)[1] == dp_i]
        out.append({"kind": "uneven_sequence_length", "dp_replica": dp_i, "ranks": ranks, "factor": factor,
                    "expected_findings": ["straggler"],
                    "description": f"dp replica {dp_i} trains on sequences {factor}x longer"})
    if f.no_overlap and L.dp * L.cp > 1:
        out.append({"kind": "no_overlap", "dim": "dp", "ranks": list(range(topo.world)),
                    "expected_findings": ["unoverlapped_collective", "communication_bound"],
                    "description": "gradient buckets all-reduced after backward, one at a time"})
    if L.pp > 1 and L.microbatches < L.pp:
        out.append({"kind": "too_few_microbatches", "dim": "pp", "microbatches": L.microbatches, "stages": L.pp,
                    "ranks": list(range(topo.world)), "expected_findings": ["pipeline_bubble"],
                    "theoretical_bubble": (L.pp - 1) / (L.microbatches + L.pp - 1),
                    "description": f"{L.microbatches} micro-batches for {L.pp} stages"})
    if f.tp_across_hosts and L.tp > 1:
        gs = [list(g.ranks) for g in topo.groups.values() if g.dim == "tp" and g.hosts > 1]
        out.append({"kind": "groups_span_hosts", "dim": "tp", "groups": {"tp": gs},
                    "ranks": sorted({r for g in gs for r in g}), "expected_findings": ["placement_mismatch"],
                    "description": "tp groups placed across hosts"})
    return out
