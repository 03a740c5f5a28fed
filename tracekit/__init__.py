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
    raise AttributeError(name)
