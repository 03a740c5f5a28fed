"""The `sitecustomize.py` that `tracekit record` puts first on the program's PYTHONPATH.

It arms `tracekit.record.inject` (which does nothing unless TRACEKIT_RECORD_CONFIG is set) and
then runs the `sitecustomize` that would have run without us, so the program's own site setup
still happens.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

PKG_ROOT_ENV = "TRACEKIT_RECORD_PKG_ROOT"
"""Directory holding the `tracekit` package, appended to sys.path if the program can't import it."""

SITECUSTOMIZE_SOURCE = '''\
"""Installed by `tracekit record` (a temporary directory first on PYTHONPATH); chains to the next sitecustomize."""
import os as _os
import sys as _sys

_here = _os.path.dirname(_os.path.abspath(__file__))


def _tracekit_arm():
    try:
        import tracekit.record.inject as _inject
    except ImportError:
        root = _os.environ.get("TRACEKIT_RECORD_PKG_ROOT")
        if not root:
            raise
        _sys.path.append(root)
        import tracekit.record.inject as _inject
    _inject.install()


def _tracekit_chain():
    import importlib.machinery
    import importlib.util

    path = [p for p in _sys.path if _os.path.abspath(p or _os.getcwd()) != _here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    _sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


try:
    _tracekit_arm()
except Exception as _exc:  # never stop the program from starting
    print("tracekit record: recorder not installed in pid %d: %r" % (_os.getpid(), _exc), file=_sys.stderr)
_tracekit_chain()
'''


class SiteDir:
    """A temporary directory holding the bootstrap sitecustomize.py; removed on `cleanup()`."""

    def __init__(self) -> None:
        self.path = Path(tempfile.mkdtemp(prefix="tracekit-record-site-"))
        (self.path / "sitecustomize.py").write_text(SITECUSTOMIZE_SOURCE)

    def pythonpath(self, existing: str | None) -> str:
        return str(self.path) + (os.pathsep + existing if existing else "")

    def cleanup(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


def package_root() -> str:
    """The directory that contains the `tracekit` package."""
    return str(Path(__file__).resolve().parents[2])
