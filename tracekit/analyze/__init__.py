"""Analyzers: each module takes a RunStore and returns typed findings (never reads JSON)."""
