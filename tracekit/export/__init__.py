"""Exports of an analysed run into the tools users already work in (Perfetto / chrome://tracing, sheets).

Exports lay out what the tables and the analysis already hold; they compute no new facts (the one
exception is re-reading matching's instances, which analysis.json summarises but does not list)."""
