"""Hypothesis settings and JSON-value strategies shared by the robustness property tests.

Example counts come from the `robustness` profile: TRACEKIT_FUZZ_EXAMPLES (default 150) so CI stays
fast; raise it locally for a longer hunt.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings, strategies as st

settings.register_profile(
    "robustness", max_examples=int(os.environ.get("TRACEKIT_FUZZ_EXAMPLES", "150")), deadline=5000,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large], derandomize=False)
FUZZ = settings.get_profile("robustness")

json_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=20),
    st.sampled_from(["X", "M", "i", "Z", "", "stream 7", "0x1f", "1e400", "-1", "NaN", "ProfilerStep#3",
                     "c10d::allreduce_", "gloo:all_reduce", "ncclKernel_AllReduce", "\x00", "\ud7ff"]),
)
json_values = st.recursive(json_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)), max_leaves=12)
