"""The GPU-semantics detection matrix (tests/simulate/gpu_matrix.py: the cells, the runs and the checks) on
its 8-rank layouts, dp4×tp2 and pp2×dp4 (both with ep4): every fault kind they can have at 3 seeds, and
3 clean runs each. The 64-rank layout's cells: tests/simulate/test_detection_matrix_gpu_64.py."""

from __future__ import annotations

import pytest

from tests.simulate.gpu_matrix import suite_tests

pytestmark = pytest.mark.slow

sim_runs, test_top_finding_names_the_injected_fault, test_clean_run_has_no_fault_finding_at_warning = suite_tests(
    ("dp4xtp2", "pp2xdp4"))
