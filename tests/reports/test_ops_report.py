"""The Ops and kernels section of report.html / summary.md, laid out from a hand-written `sections.ops`
(numbers chosen here, so the test checks layout, escaping and the SVG roofline, not the analyzer)."""

from __future__ import annotations

import re

from reports import render_html, render_markdown
from reports.ops import ops_html, ops_summary_lines

SEC = {
    "available": True, "reason": None, "top_n": 25, "notes": ["<b>note</b>"],
    "ranks": [{"rank": 0, "device": "NVIDIA H100 80GB HBM3", "device_match": "NVIDIA H100 SXM", "peak_dtype": "bf16",
               "peak_tflops": 989.4, "hbm_tbps": 3.35, "peak_source": "device_table", "steps": 2,
               "step_ns": 10_000_000, "time_basis": "steps", "model_flops": 4_000_000_000_000,
               "flops_per_step": 2e12, "achieved_tflops": 400.0, "mfu": 0.4043, "kernel_ns": 9_000_000,
               "op_kernel_ns": 8_000_000, "flops_coverage": 0.9}],
    "categories": [{"category": "gemm", "kernel_ns": 6_000_000, "share": 0.75, "ops": 10, "flops": 4_000_000_000_000}],
    "top_ops": [{"name": "aten::mm<script>", "category": "gemm", "dtype": "bf16", "input_dims": "[[8,16],[16,32]]",
                 "gemm": [1, 8, 32, 16], "formula": "gemm", "count": 10, "ranks": [0], "kernel_ns": 6_000_000,
                 "share": 0.75, "flops": 4_000_000_000_000, "bytes": 8_000_000_000, "tflops": 666.7, "tbps": 1.333,
                 "intensity": 500.0, "peak_tflops": 989.4, "roof_tflops": 989.4, "bound": "compute",
                 "pct_of_roof": 0.6738}],
    "gemm": {"shapes": 1, "count": 10, "kernel_ns": 6_000_000, "flops": 4_000_000_000_000, "tflops": 666.7},
    "kernels": [{"name": "sm90_gemm", "category": "gemm", "kind": "compute", "count": 10, "total_ns": 6_000_000,
                 "mean_ns": 600_000.0, "max_ns": 700_000, "share": 0.66, "streams": [7]}],
    "roofline": {"peak_tflops": 989.4, "hbm_tbps": 3.35, "ridge": 295.3, "dtype": "bf16", "device": "NVIDIA H100 SXM",
                 "points": [{"name": "aten::mm<script>", "category": "gemm", "intensity": 500.0, "tflops": 666.7,
                             "kernel_ns": 6_000_000}]},
    "worst": [],
}


def test_section_lays_out_the_numbers_escaped_with_an_svg_roofline():
    html = ops_html(SEC)
    assert "<script>" not in html and "aten::mm&lt;script&gt;" in html and "&lt;b&gt;note" in html
    assert "M,N,K = 8,32,16" in html and "666.7" in html and "67.4%" in html and "40.4%" in html
    svg = re.search(r"<svg .*?</svg>", html, re.S).group(0)
    assert svg.count("<circle") == 1 and "scattergl" not in html
    assert 'id="ops"' in html


def test_page_and_summary_carry_the_section():
    analysis = {"schema": "tracekit.analysis/1", "inputs": {"ranks": [0], "skipped": []}, "ranks": [],
                "findings": [], "sections": {"ops": SEC}}
    page = render_html(analysis)
    assert 'id="ops"' in page and "Ops and kernels" in page
    md = render_markdown(analysis)
    assert "Top ops by device time" in md and "MFU rank 0 40.4%" in md and "666.7" in md
    assert ops_summary_lines({"available": False}, "report.html") == []
    assert "class=na>Ops and kernels: no kernels." in ops_html({"available": False, "reason": "no kernels"})
