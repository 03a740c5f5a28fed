"""Runtime model flags shared by the tests that run the reference runtime."""

# A fault must cost real step time to be found (issue 13's rule for the GPU matrix): a small batch shrinks
# compute, not the gradient all-reduce, and a 5M-parameter model (21 MB of gradients) makes the exposed
# all-reduce ~20% of the step. With the default 0.8 MB model it was 1.3 ms (4.5% of a loaded box's step),
# under the host gaps a loaded 2-core box puts on a rank (17.5 ms/step in one CI run), which are real
# and rightly outrank it.
NO_OVERLAP_MODEL = ["--global-batch-size", "2", "--seq-len", "16", "--d-model", "256", "--d-ff", "1024",
                    "--vocab-size", "4096"]
