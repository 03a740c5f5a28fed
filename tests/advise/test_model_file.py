"""`--model FILE`: a HuggingFace-style config.json (or tracekit's own field names, JSON or TOML) gives the
model the equivalent preset gives, and the same advice."""

from __future__ import annotations

import dataclasses
import json

import pytest

from tracekit.advise.advisor import advice_json, advise
from tracekit.config import AnalysisConfig
from tracekit.flow import analyze_store
from tracekit.parse.run import parse_run
from tracekit.simulate import ClusterSpec, ParallelLayout, ModelSpec, simulate, write_traces
from tracekit.simulate.model_file import model_from_file, model_spec

LLAMA_8B_HF = {  # the fields of meta-llama/Llama-3.1-8B's config.json that shape the model
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336,
    "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8, "vocab_size": 128256,
    "max_position_embeddings": 8192, "torch_dtype": "bfloat16", "rms_norm_eps": 1e-05,
}


def _same(a: ModelSpec, b: ModelSpec) -> bool:
    return dataclasses.replace(a, name="") == dataclasses.replace(b, name="")


def test_huggingface_config_reads_as_the_preset(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(LLAMA_8B_HF))
    got = model_from_file(path)
    assert _same(got, ModelSpec.preset("llama-8b-like")) and got.name == "llama"
    mixtral = dict(LLAMA_8B_HF, model_type="mixtral", num_local_experts=8, num_experts_per_tok=2,
                   max_position_embeddings=4096, vocab_size=32000)
    path.write_text(json.dumps(mixtral))
    assert _same(model_from_file(path), ModelSpec.preset("moe-8x-like"))


def test_tracekit_fields_in_toml_and_errors(tmp_path):
    path = tmp_path / "model.toml"
    path.write_text('layers = 8\nhidden = 2048\nheads = 16\nseq = 4096\nvocab = 8192\nmicro_batch_size = 2\n')
    assert _same(model_spec(str(path)), ModelSpec.preset("tiny"))
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"hidden_size": 64}))
    with pytest.raises(ValueError, match="num_hidden_layers"):
        model_from_file(bad)
    with pytest.raises(ValueError, match="unknown model"):
        model_spec("no-such-model")


@pytest.mark.slow
def test_config_file_gives_the_presets_advice(tmp_path):
    preset = ModelSpec.preset("tiny")
    res = simulate(preset, ClusterSpec.preset("1x8-h100"), ParallelLayout(dp=2, tp=4, microbatches=2), steps=2, seed=0)
    write_traces(res, tmp_path / "traces")
    from tracekit.simulate.model_file import model_from_manifest

    from_run, source = model_from_manifest(json.loads((tmp_path / "traces" / "manifest.json").read_text()))
    assert _same(from_run, preset) and "global batch 8 sequences" in source  # dp 2 x 2 micro-batches x 2
    store = parse_run(tmp_path / "traces", tmp_path / "store", workers=1, progress=False).store
    analysis = analyze_store(store, AnalysisConfig(advice=False))
    hf = tmp_path / "config.json"
    hf.write_text(json.dumps({"num_hidden_layers": 8, "hidden_size": 2048, "num_attention_heads": 16,
                              "max_position_embeddings": 4096, "vocab_size": 8192, "torch_dtype": "bfloat16",
                              "micro_batch_size": 2}))
    cluster = ClusterSpec.preset("1x8-h100")
    a = advice_json(advise(analysis, preset, cluster, top=5))
    b = advice_json(advise(analysis, model_from_file(hf), cluster, top=5))
    def ranked(doc):
        return [(json.dumps(r["layout"], sort_keys=True), r["predicted_step_ns"]) for r in doc["ranked"]]

    assert ranked(a) == ranked(b)
    assert len(ranked(a)) >= 3 and all(ns > 0 for _, ns in ranked(a))
    assert a["warnings"] == []  # the run's own model calibrates plausibly
    wrong = advice_json(advise(analysis, ModelSpec.preset("llama-70b-like"), cluster, top=1, simulate_top=1,
                               variants_per_layout=0, near_current=0))
    assert wrong["warnings"] and any("outside (0, 1]" in w or "off (residual" in w for w in wrong["warnings"])


def test_model_from_the_runtime_manifest(tmp_path):
    from pathlib import Path

    from typer.testing import CliRunner

    from tracekit.cli.main import app
    from tracekit.simulate.model_file import model_from_manifest

    fixture = Path(__file__).resolve().parents[2] / "fixtures" / "pp_1f1b"
    manifest = json.loads((fixture / "manifest.json").read_text())
    spec, source = model_from_manifest(manifest)
    m = manifest["model"]
    assert (spec.layers, spec.hidden, spec.heads, spec.ffn_dim, spec.vocab, spec.seq) == (
        m["num_layers"], m["d_model"], m["num_heads"], m["d_ff"] * 2 // 3, m["vocab_size"], manifest["seq_len"])
    assert spec.experts == m["num_experts"] and spec.moe_every == m["moe_every"]
    assert spec.micro_batch_size == manifest["global_batch_size"] // (manifest["layout"]["dp"] * manifest["microbatches"])
    assert "manifest" in source
    assert model_from_manifest({"world_size": 2})[0] is None
    res = CliRunner().invoke(app, ["advise", str(fixture), "--out", str(tmp_path / "adv"), "-q"])
    assert res.exit_code == 0, res.output
    assert "model from the run's manifest" in res.output
    assert json.loads((tmp_path / "adv" / "advice.json").read_text())["ranked"]


@pytest.mark.parametrize("layout", [ParallelLayout(dp=2, tp=2, pp=2, ep=2, schedule="1f1b", microbatches=4),
                                    ParallelLayout(dp=8, ep=4), ParallelLayout(dp=2, tp=2, cp=2, ep=4)])
def test_manifest_model_is_the_runtime_benchmarks_model(layout):
    """The model read from a runtime manifest equals the one benchmarks/advisor_runtime_bench.py describes to
    the advisor by hand for the same flags (tests/advise/runtime_layouts.py: MAE 3.9-5.6% on 8-rank runs)."""
    from tests.advise.runtime_layouts import RuntimeModel
    from tracekit.simulate.model_file import model_from_manifest

    rm = RuntimeModel()
    manifest = {"model": {"vocab_size": rm.vocab, "d_model": rm.d_model, "num_heads": rm.heads,
                          "num_layers": rm.layers, "d_ff": rm.d_ff, "max_seq_len": 2 * rm.seq, "moe_every": 1,
                          "num_experts": rm.experts, "top_k": rm.top_k, "capacity_factor": 1.25},
                "layout": {"dp": layout.dp, "moe_layers": list(range(rm.layers))},
                "config": {"dtype": "float32"}, "seq_len": rm.seq, "global_batch_size": rm.global_batch,
                "microbatches": layout.microbatches}
    spec, _ = model_from_manifest(manifest)
    assert _same(spec, rm.spec(layout))
