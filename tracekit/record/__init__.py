"""Capture: `tracekit record`, the Recorder API and the collective log shared with the runtime."""
