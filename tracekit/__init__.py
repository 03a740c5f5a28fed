"""tracekit: profiling and trace analysis for distributed PyTorch training."""

__version__ = "0.1.0"


def __getattr__(name: str):
    # Lazy so that `import tracekit` never imports torch.
    if name in ("Recorder", "step"):
        from tracekit.record import api

        return getattr(api, name)
    if name in ("analyze_run", "AnalysisRun"):
        from tracekit import analysis

        return getattr(analysis, name)
    if name in ("open", "Run"):  # tracekit.open(DIR): the notebook API (notebook.py)
        from tracekit import notebook

        return notebook.open_run if name == "open" else notebook.Run
    raise AttributeError(name)
