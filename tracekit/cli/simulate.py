"""`tracekit simulate`: Kineto traces of a simulated GPU cluster, with injected faults and an answer key."""

from __future__ import annotations

from pathlib import Path

import typer

HELP = """Simulate training steps of a model on a GPU cluster with a parallel layout, and write what
torch.profiler + NCCL would have written: one rank{R}.pt.trace.json.gz per rank (with --trace-ranks only on
those, and comms.rank{R}.jsonl collective logs on every rank, as `tracekit record --profile-ranks` leaves), plus
.ground_truth.json (a hidden file, never an input: the injected faults and the exact answer key) and manifest.json.

Layout: --dp --tp --pp --cp --ep (ep borrows dp x cp ranks); mesh order pp, dp, cp, tp.
Presets: --model tiny | tiny-moe | llama-8b-like | llama-70b-like | moe-8x-like;
--cluster 1x8-h100 | 4x8-h100 | 128x8-h100 | HOSTSxGPUS-h100 | 1x8-a100.

Faults (repeat --fault): slow-gpu=RANK:FACTOR, slow-link=DIM:FACTOR, slow-nic=HOST:FACTOR,
stage-layers=A,B,.. (layers per stage), router-skew=EXPERT:BIAS, host-stall=RANK:MS[:EVERY],
slow-data=RANK:MS, uneven-seq=DP_REPLICA:FACTOR, no-overlap, tp-across-hosts.
Too few micro-batches: --microbatches below --pp.

Examples:
  tracekit simulate --dp 8 --tp 8 --pp 4 --schedule 1f1b --microbatches 8 --model llama-8b-like \\
      --cluster 32x8-h100 --fault slow-gpu=13:1.3 --steps 3 --seed 0 --out traces/
  tracekit simulate --pp 2 --dp 4 --cp 2 --tp 4 --ep 8 --model tiny-moe --cluster 8x8-h100 \\
      --microbatches 4 --fault router-skew=3:2.0 --out traces/ && tracekit analyze traces/

Deterministic for a seed.
"""


def register(app: typer.Typer) -> None:
    @app.command("simulate", help=HELP, no_args_is_help=True)
    def simulate_cmd(
        out: Path = typer.Option(..., "--out", "-o", help="Directory for the traces (created)."),
        dp: int = typer.Option(1, "--dp", help="Data-parallel degree."),
        tp: int = typer.Option(1, "--tp", help="Tensor-parallel degree."),
        pp: int = typer.Option(1, "--pp", help="Pipeline stages."),
        cp: int = typer.Option(1, "--cp", help="Context-parallel degree."),
        ep: int = typer.Option(1, "--ep", help="Expert-parallel degree (borrows dp x cp ranks; MoE models)."),
        fsdp: bool = typer.Option(False, "--fsdp", help="Shard parameters over dp x cp (FSDP) instead of DDP."),
        schedule: str = typer.Option("1f1b", "--schedule", help="gpipe | 1f1b | interleaved | zb"),
        microbatches: int = typer.Option(1, "--microbatches", "-m", help="Micro-batches per step (pipeline schedules)."),
        interleave: int = typer.Option(2, "--interleave", help="Virtual stages per pp rank (interleaved / zb)."),
        checkpointing: bool = typer.Option(False, "--activation-checkpointing", help="Recompute activations in the backward (checkpointing)."),
        model: str = typer.Option("tiny", "--model", help="Model preset (see above)."),
        micro_batch_size: int = typer.Option(0, "--micro-batch-size", help="Sequences per micro-batch (0: the preset's)."),
        seq: int = typer.Option(0, "--seq", help="Sequence length (0: the preset's)."),
        cluster: str = typer.Option("", "--cluster", help="Preset; default: the smallest H100 cluster that fits."),
        fault: list[str] = typer.Option([], "--fault", "-f", help="A fault (repeatable), see above."),
        steps: int = typer.Option(3, "--steps", help="Training steps to simulate (each a ProfilerStep)."),
        seed: int = typer.Option(0, "--seed", help="Random seed: the same seed gives the same traces."),
        workers: int = typer.Option(1, "--workers", "-j", help="Processes writing traces."),
        comms_logs: bool = typer.Option(False, "--comms-logs", help="Also write comms.rank{R}.jsonl (Flight Recorder entries)."),
        trace_ranks: str = typer.Option(
            "", "--trace-ranks", help="A partial recording: full traces on N ranks spread evenly (e.g. --trace-ranks 32) "
                                      "or on a rank list (e.g. --trace-ranks 0-3,12), collective logs on all."),
        without: bool = typer.Option(True, "--without/--no-without",
                                     help="Re-simulate without each fault for the answer key."),
    ) -> None:
        import time

        from tracekit.simulate import (ClusterSpec, Faults, ModelSpec, ParallelLayout, parse_fault, simulate,
                                       write_traces)

        try:
            import dataclasses

            m = ModelSpec.preset(model)
            if micro_batch_size:
                m = dataclasses.replace(m, micro_batch_size=micro_batch_size)
            if seq:
                m = dataclasses.replace(m, seq=seq)
            lay = ParallelLayout(dp=dp, tp=tp, pp=pp, cp=cp, ep=ep, dp_mode="fsdp" if fsdp else "ddp",
                                 schedule=schedule, microbatches=microbatches,
                                 virtual_stages=interleave if schedule in ("interleaved", "zb") else 1,
                                 activation_checkpointing=checkpointing)
            if not cluster:
                per = 8
                cluster = f"{max(1, -(-lay.world_size // per))}x{min(per, lay.world_size)}-h100"
            c = ClusterSpec.preset(cluster)
            f = Faults()
            for text in fault:
                f = parse_fault(text, f)
            traced = None
            if trace_ranks:
                from tracekit.record.config import parse_rank_list
                from tracekit.simulate.writer import spread_ranks

                traced = (spread_ranks(lay.world_size, int(trace_ranks)) if trace_ranks.strip().isdigit()
                          else parse_rank_list(trace_ranks))
            t0 = time.perf_counter()
            # with --trace-ranks the run is streamed (bounded memory): every rank's log is written into --out as
            # it runs, only the traced ranks' programs are kept
            res = simulate(m, c, lay, f, steps=steps, seed=seed, without=without,
                           trace_ranks=[r for r in traced if 0 <= r < lay.world_size] if traced else None,
                           logs_dir=out if traced else None)
            t1 = time.perf_counter()
            info = write_traces(res, out, workers=workers, comms_logs=comms_logs, trace_ranks=traced)
            t2 = time.perf_counter()
        except ValueError as exc:
            typer.echo(f"tracekit simulate: {exc}", err=True)
            raise typer.Exit(2) from None
        typer.echo(f"simulated {res.ranks} ranks x {steps} steps in {t1 - t0:.1f} s; step {res.mean_step_ns / 1e6:.2f} ms;"
                   f" wrote {info['events']} events in {t2 - t1:.1f} s to {out}")
        for fl in res.faults_truth:
            wo = fl.get("step_ns_without")
            tail = f" (step without it: {wo / 1e6:.2f} ms)" if wo else ""
            typer.echo(f"  fault {fl['kind']}: {fl['description']}{tail}")
