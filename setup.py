"""The optional native parts: the column builder (tracekit/parse/kscan.c) and the what-if graph's levels and
replay (tracekit/whatif/kgraph.c); everything else is in pyproject.toml.

Built by `pip install` where a C compiler is found; without one the install still succeeds, the parser
decodes with msgspec alone (tracekit/parse/native.py) and the graph is replayed by numpy (whatif/graph.py)."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("tracekit.parse.kscan", ["tracekit/parse/kscan.c"], optional=True,
                             extra_compile_args=["-O3"]),
                   Extension("tracekit.whatif.kgraph", ["tracekit/whatif/kgraph.c"], optional=True,
                             extra_compile_args=["-O3"])])
