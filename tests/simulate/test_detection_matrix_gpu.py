"""The GPU-semantics detection matrix (tests/simulate/gpu_matrix.py: the cells, the runs and the checks) on
its 8-rank layouts, dp4×tp2 and pp2×dp4 (both with ep4): every fault kind they can have at 3 seeds, and
3 clean runs each. The 64-rank layout's cells: tests/simulate/test_detection_matrix_gpu_64.py."""

from __future__ import annotations

import pytest

from tests.simulate.gpu_matrix import Runs, check_clean_cell, check_fault_cell, clean_params, fault_params

pytestmark = pytest.mark.slow

LAYOUTS_HERE = ("dp4xtp2", "pp2xdp4")


@pytest.fixture(scope="module")
def sim_runs(tmp_path_factory) -> Runs:
    return Runs(tmp_path_factory.mktemp("sim_matrix"))


@pytest.mark.parametrize("layout_name,kind,seed", fault_params(LAYOUTS_HERE))
def test_top_finding_names_the_injected_fault(sim_runs, layout_name, kind, seed):
    check_fault_cell(sim_runs, layout_name, kind, seed)


@pytest.mark.parametrize("layout_name,seed", clean_params(LAYOUTS_HERE))
def test_clean_run_has_no_fault_finding_at_warning(sim_runs, layout_name, seed):
    check_clean_cell(sim_runs, layout_name, seed)
