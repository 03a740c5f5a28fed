"""The instrumented reference runtime: a tiny MoE transformer trained with pp x dp x cp x tp (ep over dp x cp),
profiled per rank, with injectable performance faults and their ground truth.

    python -m instrumented_runtime --pp 2 --dp 2 --cp 2 --tp 2 --ep 4 --schedule 1f1b --microbatches 4 \\
        --steps 4 [--dp-mode ddp|fsdp] [fault knobs] --out DIR

Forks its own gloo ranks (or joins torchrun when RANK/WORLD_SIZE are set; nccl when CUDA is present).

Modules, in the order a run uses them: config (RunConfig/ModelConfig/FaultConfig, CLI) -> parallel_dims
(ParallelDims, the named DeviceMesh, ep/edp groups) -> model (nanoGPT-style transformer, MoE blocks) ->
pipeline (stage split, torch.distributed.pipelining schedules with pp labels) -> parallelize (apply_tp /
apply_cp / apply_ep / apply_ddp / apply_fsdp, extra grad syncs) -> data (seeded synthetic tokens) -> faults
(compute slow-down, ground truth) -> profiling -> train (per-rank loop) -> manifest -> launch. B2 owns comm
(logged collectives, Megatron/EP autograd helpers), ring_attention and moe.

DIR receives, per rank R: rank{R}.pt.trace.json.gz (last --profile-steps steps after one warm-up),
comms.rank{R}.jsonl (every collective/P2P the runtime issues, DDP/FSDP2/pipelining included),
routing.rank{R}.jsonl (MoE), metrics.rank{R}.jsonl (per-step token-loss sum, tokens, step time); and once:
manifest.json, .ground_truth.json, train_log.json (global loss per step).

Fault knobs (each recorded in .ground_truth.json with the ranks/groups/stages/experts it affects):
--slow-rank R --slow-factor F, --stage-layers 3,1, --router-bias E=B[,E=B], --no-overlap,
--microbatches M < pp (too few micro-batches), --slow-link DIM=SECONDS (tp, cp, ep, dp, pp, edp),
--host-stall-rank R --host-stall-ms X, --uneven-seq-rank R [--uneven-seq-factor K], --ranks-per-host N.
"""
