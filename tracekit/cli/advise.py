"""`tracekit advise`: which parallel layout to run, predicted from one measured run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer

if TYPE_CHECKING:
    from tracekit.simulate import ModelSpec

HELP = """Predict step time, throughput and memory of other parallel layouts from one measured run, and rank
them. TRACES is a trace directory (analysed first, like `tracekit analyze`) or an analysis.json.
The measured run calibrates the GPUs' compute efficiency and each link tier's bus bandwidth; the
simulator (tracekit simulate) predicts every shortlisted layout; memory comes from the memory model.

Examples:
  tracekit advise traces/ --model llama-8b-like --hosts 4 --gpus-per-host 8 --out advice/
  tracekit advise out/analysis.json --model tiny --gpus 1024 --gpu-memory 80GB --global-batch 512
  tracekit advise traces/ --model moe-8x-like --link intra=300,inter=40 --top 5

Writes DIR/advice.json (schema tracekit.advice/1) and DIR/advice.md (for a pull-request comment).
Exit 0 when advice was produced, 1 when the run could not be analysed or calibrated.
"""


def _bytes(text: str) -> int:
    units = {"": 1, "B": 1, "KB": 1 << 10, "MB": 1 << 20, "GB": 1 << 30, "TB": 1 << 40}
    t = text.strip().upper().replace("IB", "B")
    num = t.rstrip("KMGTB")
    return int(float(num) * units[t[len(num):]])


def _links(text: str | None) -> dict[str, float]:
    out: dict[str, float] = {}
    for part in filter(None, (text or "").split(",")):
        k, _, v = part.partition("=")
        if k not in ("intra", "inter"):
            raise typer.BadParameter(f"--link takes intra=GB/s,inter=GB/s, got {part!r}")
        out[f"{k}_bw_gbs"] = float(v.upper().replace("GB/S", ""))
    return out


def _analysis(traces: Path, quiet: bool) -> tuple[dict, dict | None]:
    """The analysis and the run's manifest (None for an analysis.json)."""
    if traces.is_file() and traces.suffix == ".json":
        return json.loads(traces.read_text()), None
    from tracekit.analysis import analyze_run

    run = analyze_run(traces, progress=not quiet)
    return run.analysis, run.store.manifest


def _model_of(model: str | None, manifest: dict | None, micro_batch_size: int, seq: int,
              global_batch: int | None) -> tuple["ModelSpec", dict[str, str]]:
    """The model the advice uses, and where it and the batch came from: --model (a preset or a file), else
    the run's manifest; the micro-batch from --micro-batch-size, else the run (its manifest: the batch the
    run trained with, whatever the model was named from), else the preset's / file's."""
    import dataclasses

    from tracekit.simulate.model_file import model_from_manifest, model_spec, run_batch

    if model is not None:
        spec, src = model_spec(model), f"from --model {model}"
    else:
        spec, src = model_from_manifest(manifest)
        if spec is None:
            raise ValueError(f"no --model given and {src}: pass --model PRESET or --model config.json")
    batch = run_batch(manifest)
    if micro_batch_size:
        spec = dataclasses.replace(spec, micro_batch_size=micro_batch_size)
        bsrc = f"micro-batch {micro_batch_size} sequences from --micro-batch-size"
    elif batch is not None:
        spec = dataclasses.replace(spec, micro_batch_size=batch[0])
        bsrc = f"micro-batch {batch[0]} sequences from {batch[2]}"
    else:
        bsrc = (f"micro-batch {spec.micro_batch_size} sequences {src} (the run does not say its batch: "
                "pass --micro-batch-size if it differs)")
    run_seq = manifest.get("seq_len") if isinstance(manifest, dict) else None
    if seq:
        spec = dataclasses.replace(spec, seq=seq)
        bsrc += f"; sequences of {seq} tokens from --seq"
    elif isinstance(run_seq, int) and run_seq > 0 and run_seq != spec.seq:
        bsrc += f"; sequences of {run_seq} tokens from the run's manifest (not the model's {spec.seq})"
        spec = dataclasses.replace(spec, seq=run_seq)
    sources = {"model": src, "batch": bsrc}
    if global_batch:
        sources["global_batch"] = f"global batch {global_batch} sequences from --global-batch"
    return spec, sources


def register(app: typer.Typer) -> None:
    @app.command("advise", help=HELP, no_args_is_help=True)
    def advise_cmd(
        traces: Path = typer.Argument(..., help="Trace directory, run store, or analysis.json."),
        model: Optional[str] = typer.Option(None, "--model", help="Model preset (tiny, tiny-moe, llama-8b-like, llama-70b-like, moe-8x-like) or a model file: JSON/TOML with the model's shape (a HuggingFace config.json works). Default: the model the run's manifest names (the reference runtime writes it)."),
        cluster: str = typer.Option("1x8-h100", "--cluster", help="Cluster description the calibration starts from."),
        gpus: Optional[int] = typer.Option(None, "--gpus", help="Target GPU count (default: the measured run's)."),
        hosts: Optional[int] = typer.Option(None, "--hosts", help="Target host count (default: the target GPU count over --gpus-per-host, rounded up)."),
        gpus_per_host: Optional[int] = typer.Option(None, "--gpus-per-host", help="GPUs per target host (default: the cluster's)."),
        gpu_memory: Optional[str] = typer.Option(None, "--gpu-memory", help="Device memory, e.g. 80GB."),
        link: Optional[str] = typer.Option(None, "--link", help="Bus bandwidth per tier, e.g. intra=360,inter=45 (GB/s)."),
        global_batch: Optional[int] = typer.Option(None, "--global-batch", help="Sequences per step (kept across layouts)."),
        micro_batch_size: int = typer.Option(0, "--micro-batch-size", help="Sequences per micro-batch of the measured run (default: the run's, from its manifest; else the model's)."),
        seq: int = typer.Option(0, "--seq", help="Sequence length (0: the run's, from its manifest; else the model's)."),
        top: int = typer.Option(10, "--top", help="How many of the best layouts to list."),
        out: Path = typer.Option(Path("tracekit-advice"), "--out", "-o", help="Output directory for advice.json and advice.md (created)."),
        quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar and no summary (errors still print)."),
    ) -> None:
        import dataclasses

        from rich.console import Console

        from reports.advice import render_advice_markdown
        from tracekit.advise.advisor import advice_json, advise
        from tracekit.advise.schema import validate_advice
        from tracekit.simulate import ClusterSpec
        from tracekit.simulate.model_file import model_text

        err = Console(stderr=True)
        try:
            c = dataclasses.replace(ClusterSpec.preset(cluster), **_links(link))
            analysis, manifest = _analysis(traces, quiet)
            m, sources = _model_of(model, manifest, micro_batch_size, seq, global_batch)
            err.print(f"model used: {model_text(m)} ({sources['model']})", markup=False, highlight=False)
            err.print(f"batch: {sources['batch']}", markup=False, highlight=False)
            adv = advise(analysis, m, c, gpus=gpus, hosts=hosts, gpus_per_host=gpus_per_host,
                         global_batch=global_batch, gpu_memory_bytes=_bytes(gpu_memory) if gpu_memory else None, top=top,
                         sources=sources)
        except (ValueError, OSError, KeyError) as exc:
            err.print(f"[red]cannot advise:[/red] {exc}", markup=True, highlight=False)
            raise typer.Exit(1)
        doc = advice_json(adv)
        validate_advice(doc)
        out.mkdir(parents=True, exist_ok=True)
        (out / "advice.json").write_text(json.dumps(doc, indent=1) + "\n")
        text = render_advice_markdown(doc)
        (out / "advice.md").write_text(text)
        for w in doc.get("warnings") or []:
            err.print(f"[yellow]warning:[/yellow] {w}", markup=True, highlight=False)
        if not quiet:
            from rich.markdown import Markdown

            Console(width=100).print(Markdown(text))
        err.print(f"advice: {out / 'advice.json'}   markdown: {out / 'advice.md'}", markup=False)
