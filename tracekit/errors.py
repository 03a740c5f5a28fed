"""tracekit's error types: one root so callers can tell our clear errors from bugs."""

from __future__ import annotations

HANG_EXIT_CODE = 3
"""`tracekit analyze` (and `tracekit record` after a hang) exit with this when the run is diagnosed hung."""


class TracekitError(Exception):
    """Root of every error tracekit raises on purpose."""


class TraceFormatError(TracekitError):
    """A trace file could not be read: names the file and the reason."""

    def __init__(self, file: str, reason: str) -> None:
        super().__init__(f"{file}: {reason}")
        self.file = str(file)
        self.reason = reason


class RankIdentityError(TraceFormatError):
    """A file's rank cannot be determined, or two files claim the same rank."""


class UnsafeInputError(TraceFormatError):
    """An input tried to do something we never allow (e.g. a pickle that calls a function)."""


class InputTooLargeError(TraceFormatError):
    """An input exceeds a configured budget (e.g. decompressed size)."""


class StoreError(TracekitError):
    """A run store is missing or malformed."""


class NothingToAnalyzeError(TracekitError):
    """No input could be analysed at all."""
