"""The optional native parts: the column builder (tracekit/parse/kscan.c), the what-if graph's levels and
replay (tracekit/whatif/kgraph.c) and string column ids by identity (tracekit/tables/kcolumns.c); everything
else is in pyproject.toml.

Built by `pip install` where a C compiler is found; without one the install still succeeds and the same
results come from Python: the parser decodes with msgspec alone (tracekit/parse/native.py), numpy replays the
graph (whatif/graph.py), a dict codes each row (tables/columns.py)."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("tracekit.parse.kscan", ["tracekit/parse/kscan.c"], optional=True,
                             extra_compile_args=["-O3"]),
                   Extension("tracekit.whatif.kgraph", ["tracekit/whatif/kgraph.c"], optional=True,
                             extra_compile_args=["-O3"]),
                   Extension("tracekit.tables.kcolumns", ["tracekit/tables/kcolumns.c"], optional=True,
                             extra_compile_args=["-O3"])])
