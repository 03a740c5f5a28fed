"""`advice.md`: the layout advisor's ranked table for a pull-request comment (lays out advice.json)."""

from __future__ import annotations

from typing import Any

from reports.escape import md


def _layout(lay: dict[str, Any]) -> str:
    dims = " × ".join(f"{k}{lay[k]}" for k in ("dp", "tp", "pp", "cp", "ep") if lay[k] > 1) or "1 GPU"
    extra = []
    if lay["pp"] > 1:
        extra.append(f"{lay['schedule']} m={lay['microbatches']}" + (f" v={lay['interleave']}" if lay["interleave"] > 1 else ""))
    if lay["fsdp"]:
        extra.append("FSDP")
    if lay["activation_checkpointing"]:
        extra.append("AC")
    return dims + (f" ({', '.join(extra)})" if extra else "")


def _row(i: str, c: dict[str, Any]) -> str:
    fits = "yes" if c["fits_in_memory"] else "**no**"
    return (f"| {i} | {md(_layout(c['layout']))} | {c['predicted_step_ns'] / 1e6:.1f} ms | "
            f"{c['tokens_per_s_per_gpu']:,.0f} | {100 * c['mfu']:.0f}% | {c['peak_memory_bytes'] / 2**30:.1f} GiB | "
            f"{fits} | {md('; '.join(c['changes']) or '—')} | {md(c['why'] or '—')} |")


def render_advice_markdown(advice: dict[str, Any]) -> str:
    t, cal = advice["target"], advice["calibration"]
    lines = ["## tracekit layout advice", "",
             f"Target: {t['gpus']} GPUs ({t['hosts']} hosts × {t['gpus_per_host']}), global batch "
             f"{t['global_batch']} sequences of {advice['model']['seq']} tokens, "
             f"{t['gpu_memory_bytes'] / 2**30:.0f} GiB per GPU.", "",
             "Calibrated from the measured run: " + md("; ".join(cal["notes"])) + ".", ""]
    cur = advice.get("current")
    if cur:
        lines += [f"Current layout {md(_layout(cur['layout']))}: measured {cur['measured_step_ns'] / 1e6:.1f} ms, "
                  f"predicted {cur['predicted_step_ns'] / 1e6:.1f} ms per step.", ""]
    lines += ["| # | layout | step | tokens/s/GPU | MFU | peak memory | fits | changes | why |",
              "|---|---|---|---|---|---|---|---|---|"]
    lines += [_row(str(i), c) for i, c in enumerate(advice["ranked"], 1)]
    lines += ["", f"{advice['layouts_considered']} valid layouts considered, {advice['layouts_simulated']} simulated."]
    return "\n".join(lines) + "\n"
