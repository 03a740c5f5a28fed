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
