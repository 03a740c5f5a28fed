"""The `tracekit` command line: one module per command, each a thin layer over the library."""
