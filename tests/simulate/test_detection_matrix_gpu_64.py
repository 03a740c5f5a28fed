"""The GPU-semantics detection matrix (tests/simulate/gpu_matrix.py: the cells, the runs and the checks) on
its 64-rank 5-D layout, pp2 × dp8 × cp2 × tp2 with ep4 over dp × cp on 8 hosts of 8 GPUs: 3 seeds of the faults
only it can have (a slow NIC, tp groups across hosts), seed 0 of every other fault plus seed 2 of a slow link
(its cp link), seed 0 of the clean run (`SWEEP_ONLY`). A file of its own so that the other pytest-xdist worker
runs the 8-rank layouts (tests/simulate/test_detection_matrix_gpu.py) beside it; ~10 s CPU a run."""

from __future__ import annotations

import pytest

from tests.simulate.gpu_matrix import suite_tests

pytestmark = pytest.mark.slow

sim_runs, test_top_finding_names_the_injected_fault, test_clean_run_has_no_fault_finding_at_warning = suite_tests(
    ("5d-64",))
