"""pyarrow without pandas until pandas is really used.

pyarrow's `pa.array(...)` asks, on its first call, whether pandas is installed (to recognise Series
and Categoricals), and answers by importing it: ~0.3 s of CPU and ~60 MB in a process that never
touches a DataFrame (`tracekit parse`, a pool worker); its C++ sequence converter asks again on
every call until an import succeeds. Inside `pandas_deferred()` the answer is "not installed";
leaving it arms a one-shot import hook: the moment anything imports pandas, pyarrow's pandas
integration is switched on again, so Series→Arrow conversions keep pandas semantics (NaN → null,
Categorical → dictionary) for every caller.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from contextlib import contextmanager
from typing import Any, Iterator

_PANDAS = "pandas"


class _RefusePandas(importlib.abc.MetaPathFinder):
    """Installed only around pyarrow's probe: `import pandas` raises ImportError."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if name == _PANDAS:
            raise ModuleNotFoundError("pandas import deferred by tracekit", name=name)
        return None


class _HealingLoader(importlib.abc.Loader):
    """pandas' own loader; after pandas has run, pyarrow's pandas integration is turned back on."""

    def __init__(self, loader: Any) -> None:
        self.loader = loader

    def create_module(self, spec: Any) -> Any:
        return self.loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self.loader.exec_module(module)
        enable_pyarrow_pandas()

    def __getattr__(self, name: str) -> Any:  # get_resource_reader, is_package, ...
        return getattr(self.loader, name)


class _WatchPandas(importlib.abc.MetaPathFinder):
    """One-shot: on the first `import pandas`, wraps its loader in _HealingLoader and steps aside."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != _PANDAS:
            return None
        _remove(self)
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.loader is not None:
            spec.loader = _HealingLoader(spec.loader)
        return spec


def _remove(finder: Any) -> None:
    try:
        sys.meta_path.remove(finder)
    except ValueError:
        pass


def enable_pyarrow_pandas() -> None:
    """Make pyarrow's lazy pandas shim import pandas now (a no-op when it already has)."""
    import pyarrow as pa

    shim = getattr(pa.lib, "_pandas_api", None)
    if shim is not None:
        try:
            shim.pd  # noqa: B018 -- the property imports pandas and records its types
        except ImportError:
            pass


@contextmanager
def pandas_deferred() -> Iterator[None]:
    """Within: pyarrow runs without importing pandas (an `import pandas` inside raises ImportError, so
    only code that never uses pandas belongs here: the parsers and the store writer). Afterwards the
    first `import pandas` turns pyarrow's pandas integration back on. A no-op when pandas is imported."""
    if _PANDAS in sys.modules:
        yield
        return
    refuse = _RefusePandas()
    sys.meta_path.insert(0, refuse)
    try:
        yield
    finally:
        _remove(refuse)
        if _PANDAS not in sys.modules and not any(isinstance(f, _WatchPandas) for f in sys.meta_path):
            sys.meta_path.insert(0, _WatchPandas())


def defer_pandas() -> None:
    """Answer pyarrow's "is pandas installed?" probe now, inside `pandas_deferred()`: later conversions
    (`pa.table`, `pa.array`) no longer import pandas; code that imports it itself switches pyarrow's
    pandas integration back on. For the analysis of a run store, which parsing did not probe for."""
    import pyarrow as pa

    with pandas_deferred():
        pa.array([0])
