"""The GPU-semantics detection matrix (tests/simulate/gpu_matrix.py: the cells, the runs and the checks) on
its 64-rank 5-D layout, pp2 × dp8 × cp2 × tp2 with ep4 over dp × cp on 8 hosts of 8 GPUs: 3 seeds of the faults
only it can have (a slow NIC, tp groups across hosts), seed 0 of every other fault plus seed 2 of a slow link
(its cp link), seed 0 of the clean run (`SWEEP_ONLY`). A file of its own so that the other pytest-xdist worker
runs the 8-rank layouts (tests/simulate/test_detection_matrix_gpu.py) beside it; ~10 s CPU a run."""

from __future__ import annotations

import pytest

from tests.simulate.gpu_matrix import Runs, check_clean_cell, check_fault_cell, clean_params, fault_params

pytestmark = pytest.mark.slow

LAYOUTS_HERE = ("5d-64",)


@pytest.fixture(scope="module")
def sim_runs(tmp_path_factory) -> Runs:
    return Runs(tmp_path_factory.mktemp("sim_matrix_64"))


@pytest.mark.parametrize("layout_name,kind,seed", fault_params(LAYOUTS_HERE))
def test_top_finding_names_the_injected_fault(sim_runs, layout_name, kind, seed):
    check_fault_cell(sim_runs, layout_name, kind, seed)


@pytest.mark.parametrize("layout_name,seed", clean_params(LAYOUTS_HERE))
def test_clean_run_has_no_fault_finding_at_warning(sim_runs, layout_name, seed):
    check_clean_cell(sim_runs, layout_name, seed)
