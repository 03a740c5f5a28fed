"""Simulated GPU clusters: Kineto traces with GPU/NCCL semantics and an exact answer key.

    from tracekit.simulate import ModelSpec, ClusterSpec, ParallelLayout, Faults, simulate, write_traces, step_time
"""

from tracekit.layout import ParallelLayout
from tracekit.simulate.api import Prediction, SimResult, predict, simulate, step_time
from tracekit.simulate.specs import CLUSTER_PRESETS, MODEL_PRESETS, ClusterSpec, Faults, ModelSpec, parse_fault
from tracekit.simulate.writer import write_traces

__all__ = ["CLUSTER_PRESETS", "MODEL_PRESETS", "ClusterSpec", "Faults", "ModelSpec", "ParallelLayout", "Prediction",
           "SimResult", "parse_fault", "predict", "simulate", "step_time", "write_traces"]
