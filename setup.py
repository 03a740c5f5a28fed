"""The optional native column builder (tracekit/parse/kscan.c); everything else is in pyproject.toml.

Built by `pip install` where a C compiler is found; without one the install still succeeds and the parser
decodes with msgspec alone (tracekit/parse/native.py)."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("tracekit.parse.kscan", ["tracekit/parse/kscan.c"], optional=True,
                             extra_compile_args=["-O3"])])
