"""The instrumented reference runtime: a tiny MoE transformer trained with pp x dp x cp x tp (+ ep over dp x cp),
profiled per rank, with injectable performance faults and their ground truth. Run `python -m instrumented_runtime`.
"""
