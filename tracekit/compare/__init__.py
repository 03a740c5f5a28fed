"""Comparing analyses: `diff` (before/after, `tracekit.diff/1`), `attribution` (why the step changed: the
base run's graph replayed with the new run's durations, cause by cause), `check` (thresholds for CI gates)
and `expect` (a run against an advice.json or a previous run's analysis.json).

Both take analysis.json documents; `diff.load_analysis` gets one from any input through
tracekit.analyze_run (traces, a run store) or reads a saved one.
"""
