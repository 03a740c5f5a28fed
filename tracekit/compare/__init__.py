"""Comparing analyses: `diff` (before/after, `tracekit.diff/1`) and `check` (thresholds for CI gates).

Both take analysis.json documents; `diff.load_analysis` gets one from any input through
tracekit.analyze_run (traces, a run store) or reads a saved one.
"""
