"""A model's shape from a file: a HuggingFace `config.json` read as such, or tracekit's own field names
(JSON or TOML), for `--model PATH` where a preset name is also accepted (`model_spec`).

HuggingFace keys → ModelSpec: num_hidden_layers → layers, hidden_size → hidden, num_attention_heads →
heads, num_key_value_heads → kv_heads, intermediate_size (MoE: moe_intermediate_size when given) → ffn,
vocab_size → vocab, num_local_experts / num_experts / n_routed_experts → experts, num_experts_per_tok →
top_k, torch_dtype → dtype_bytes, seq_length / max_sequence_length / max_position_embeddings → seq (the
first present; `--seq` overrides). tracekit's own names (layers, hidden, heads, ...) win over HF keys.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from tracekit.simulate.specs import MODEL_PRESETS, ModelSpec

HF_KEYS: dict[str, tuple[str, ...]] = {
    "layers": ("num_hidden_layers", "n_layer", "num_layers"),
    "hidden": ("hidden_size", "n_embd", "d_model"),
    "heads": ("num_attention_heads", "n_head"),
    "kv_heads": ("num_key_value_heads",),
    "ffn": ("moe_intermediate_size", "intermediate_size", "ffn_hidden_size", "n_inner"),
    "vocab": ("vocab_size",),
    "experts": ("num_local_experts", "num_experts", "n_routed_experts"),
    "top_k": ("num_experts_per_tok", "moe_topk"),
    "seq": ("seq_length", "max_sequence_length", "max_position_embeddings", "n_positions"),
}
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "half": 2, "float32": 4, "float": 4, "float8": 1, "fp8": 1}


def _load(path: Path) -> dict[str, Any]:
    text = path.read_text(encoding="utf-8")
    if path.suffix.lower() == ".toml":
        import tomllib

        doc = tomllib.loads(text)
    else:
        doc = json.loads(text)
    if not isinstance(doc, dict):
        raise ValueError(f"{path}: a model file is a JSON/TOML object")
    return doc.get("text_config") if isinstance(doc.get("text_config"), dict) else doc


def model_from_file(path: str | Path) -> ModelSpec:
    """The ModelSpec a config file describes (module docstring); ValueError when a required field is missing."""
    path = Path(path)
    doc = _load(path)
    fields = {f.name for f in dataclasses.fields(ModelSpec)}
    values: dict[str, Any] = {}
    for name, keys in HF_KEYS.items():
        for key in (name,) + keys:
            if isinstance(doc.get(key), int) and not isinstance(doc.get(key), bool):
                values[name] = doc[key]
                break
    values.update({k: v for k, v in doc.items() if k in fields and k not in values and k != "name"})
    missing = [k for k in ("layers", "hidden", "heads") if k not in values]
    if missing:
        raise ValueError(f"{path}: no {', '.join(missing)} (HuggingFace num_hidden_layers / hidden_size / "
                         "num_attention_heads, or tracekit's layers / hidden / heads)")
    dtype = str(doc.get("torch_dtype") or doc.get("dtype") or "").lower()
    if dtype in DTYPE_BYTES and "dtype_bytes" not in doc:
        values["dtype_bytes"] = DTYPE_BYTES[dtype]
    name = str(doc.get("name") or doc.get("_name_or_path") or doc.get("model_type") or path.stem)
    return ModelSpec(name=name, **values)


def model_spec(text: str) -> ModelSpec:
    """A preset name, or the path of a model file."""
    if text in MODEL_PRESETS:
        return MODEL_PRESETS[text]
    path = Path(text)
    if path.is_file():
        return model_from_file(path)
    raise ValueError(f"unknown model {text!r}: a preset ({', '.join(MODEL_PRESETS)}) or a JSON/TOML model file "
                     "(a HuggingFace config.json works)")


def model_from_manifest(manifest: dict[str, Any] | None) -> tuple[ModelSpec | None, str]:
    """The model a run's manifest describes (the reference runtime writes `model`, `seq_len`,
    `global_batch_size`, `microbatches` and its layout), and a line saying where each field came from;
    (None, why) when the manifest names no model."""
    if not isinstance(manifest, dict) or not isinstance(manifest.get("model"), dict):
        return None, "the run's manifest names no model"
    m, lay = manifest["model"], manifest.get("layout") if isinstance(manifest.get("layout"), dict) else {}
    if isinstance(m.get("hidden"), int):  # tracekit simulate writes the ModelSpec itself
        names = {f.name for f in dataclasses.fields(ModelSpec)}
        spec = ModelSpec(**{k: v for k, v in m.items() if k in names})
        return spec, (f"model from the run's manifest ({spec.name}: {spec.layers} layers, hidden {spec.hidden}); "
                      f"micro-batch {spec.micro_batch_size} sequences, global batch "
                      f"{manifest.get('global_batch_size')} sequences of {spec.seq} tokens per step")
    need = ("num_layers", "d_model", "num_heads")
    if not all(isinstance(m.get(k), int) for k in need):
        return None, "the run's manifest model lacks " + ", ".join(k for k in need if not isinstance(m.get(k), int))
    moe = bool(lay.get("moe_layers")) and int(m.get("num_experts") or 0) > 0
    dp, mb = int(lay.get("dp") or 1), int(manifest.get("microbatches") or 1)
    gbs = manifest.get("global_batch_size")
    mbs = gbs // (dp * mb) if isinstance(gbs, int) and gbs % (dp * mb) == 0 and gbs >= dp * mb else 1
    cfg = manifest.get("config") if isinstance(manifest.get("config"), dict) else {}
    # the runtime's MLP has two matrices of d_ff; the simulator's three (SwiGLU) at 2/3 of it have its FLOPs;
    # attention stays within each sequence (packed_attention False)
    spec = ModelSpec(name="run manifest", layers=m["num_layers"], hidden=m["d_model"], heads=m["num_heads"],
                     ffn=int(m.get("d_ff") or 4 * m["d_model"]) * 2 // 3, vocab=int(m.get("vocab_size") or 32000),
                     packed_attention=False,
                     seq=int(manifest.get("seq_len") or m.get("max_seq_len") or 512),
                     experts=int(m["num_experts"]) if moe else 0, top_k=int(m.get("top_k") or 2),
                     moe_every=int(m.get("moe_every") or 1) if moe else 1,
                     capacity_factor=float(m.get("capacity_factor") or 0.0) if moe else 0.0,
                     dtype_bytes=DTYPE_BYTES.get(str(cfg.get("dtype") or "bfloat16").lower(), 2),
                     micro_batch_size=mbs)
    source = (f"model from the run's manifest: {spec.layers} layers, hidden {spec.hidden}, {spec.heads} heads, "
              f"MLP d_ff {m.get('d_ff')} (as ffn {spec.ffn_dim} of three matrices), vocab {spec.vocab}, seq {spec.seq}"
              + (f", {spec.experts} experts top-{spec.top_k} every {spec.moe_every} layers" if spec.experts else "")
              + f"; micro-batch {spec.micro_batch_size} = global batch {gbs} / (dp {dp} x {mb} micro-batches)")
    return spec, source


def run_batch(manifest: dict[str, Any] | None) -> tuple[int, int, str] | None:
    """(micro-batch size, global batch, where from) of the run a manifest describes: its
    `global_batch_size` over (dp × micro-batches) from its layout; None when the manifest does not say."""
    if not isinstance(manifest, dict):
        return None
    lay = manifest.get("layout") if isinstance(manifest.get("layout"), dict) else {}
    gbs, mb = manifest.get("global_batch_size"), manifest.get("microbatches") or lay.get("microbatches") or 1
    dp = lay.get("dp")
    if dp is None and isinstance(lay.get("mesh_dim_names"), list) and "dp" in lay["mesh_dim_names"]:
        dp = lay["mesh_shape"][lay["mesh_dim_names"].index("dp")]
    if not all(isinstance(x, int) and x > 0 for x in (gbs, mb, dp)) or gbs % (dp * mb):
        return None
    mbs = gbs // (dp * mb)
    return mbs, gbs, (f"the run's manifest: global batch {gbs} sequences = dp {dp} x {mb} micro-batches x "
                      f"micro-batch {mbs}")


def model_text(spec: ModelSpec) -> str:
    """The model the advisor uses, in one line."""
    moe = f", {spec.experts} experts top-{spec.top_k} every {spec.moe_every} layers" if spec.experts else ""
    kv = f" ({spec.kv_heads} kv)" if spec.kv_heads and spec.kv_heads != spec.heads else ""
    return (f"{spec.name}: {spec.layers} layers, hidden {spec.hidden}, {spec.heads} heads{kv}, ffn {spec.ffn_dim}, "
            f"vocab {spec.vocab}, seq {spec.seq}{moe}, {spec.dtype_bytes}-byte values, micro-batch "
            f"{spec.micro_batch_size} sequences")
