"""The memory model's static part against torch's own parameter counts, and its in-flight rule."""

from __future__ import annotations

from tracekit.layout import ParallelLayout
from tracekit.model.memory import ModelShape, in_flight_microbatches, predict, stage_params


def test_stage_parameters_match_the_runtime_modules():
    from instrumented_runtime.config import ModelConfig
    from instrumented_runtime.model import Transformer, count_params
    from instrumented_runtime.pipeline import build_stage_module

    cfg = ModelConfig(d_model=32, num_heads=4, num_layers=4, d_ff=64, vocab_size=128, max_seq_len=128, moe_every=0)
    shape = ModelShape(num_layers=4, d_model=32, d_ff=64, num_heads=4, vocab_size=128, seq_len=32,
                       microbatch_size=2, max_seq_len=128)
    full = Transformer(cfg)
    for p in (1, 2, 4):
        split = ParallelLayout(pp=p).stage_layer_ids(4)
        for s in range(p):
            module = build_stage_module(full, split[s], s == 0, s == p - 1)
            assert stage_params(shape, ParallelLayout(pp=p), s) == count_params(module), (p, s)


def test_in_flight_microbatches_per_schedule():
    assert [in_flight_microbatches("1f1b", 4, 8, s) for s in range(4)] == [4, 3, 2, 1]
    assert [in_flight_microbatches("1f1b", 4, 2, s) for s in range(4)] == [2, 2, 2, 1]
    assert [in_flight_microbatches("gpipe", 4, 8, s) for s in range(4)] == [8, 8, 8, 8]
    assert in_flight_microbatches("1f1b", 1, 8, 0) == 1


def test_fsdp_shards_and_optimizer_state_is_counted_when_the_counter_sees_it():
    shape = ModelShape(num_layers=4, d_model=64, d_ff=256, num_heads=4, vocab_size=128, seq_len=64,
                       microbatch_size=2, max_seq_len=256)
    ddp = predict(shape, ParallelLayout(dp=4))[0]
    fsdp = predict(shape, ParallelLayout(dp=4, dp_mode="fsdp"))[0]
    assert fsdp.params * 4 == ddp.params and fsdp.optimizer == 2 * fsdp.params


def test_fits_rules_out_layouts_by_their_fullest_stage():
    from tracekit.model.memory import fits, peak_bytes

    shape = ModelShape(num_layers=8, d_model=1024, d_ff=4096, num_heads=8, vocab_size=32000, seq_len=2048,
                       microbatch_size=1, bytes_per_value=2)
    gpipe, one_f1b = ParallelLayout(pp=4, schedule="gpipe", microbatches=16), ParallelLayout(pp=4, schedule="1f1b", microbatches=16)
    assert peak_bytes(shape, gpipe) > peak_bytes(shape, one_f1b)
    limit = (peak_bytes(shape, gpipe) + peak_bytes(shape, one_f1b)) // 2
    assert fits(shape, one_f1b, int(limit / 0.9)) and not fits(shape, gpipe, int(limit / 0.9))


def test_interleaved_warm_up_in_chunks():
    from tracekit.model.memory import in_flight_chunks

    # torch's Interleaved1F1B warm-up: (p - r - 1) * 2 + (v - 1) * p + 1 chunk forwards (capped at m * v)
    assert [in_flight_chunks("interleaved", 2, 4, r, 2) for r in range(2)] == [5, 3]
    assert [in_flight_chunks("interleaved", 4, 2, r, 2) for r in range(4)] == [4, 4, 4, 4]
    assert in_flight_chunks("1f1b", 4, 8, 1, 1) == 3
