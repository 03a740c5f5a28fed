"""Parsers: the only code that reads raw trace files and collective logs."""
