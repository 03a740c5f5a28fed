"""What analysis concludes: the finding, its evidence and severity, the recommendation rules, and the result
every analysis step returns. Imports nothing of tracekit's but its errors: every layer above may use it.

    from tracekit.findings import Finding, FindingKind, Severity
"""

from tracekit.findings.finding import Finding, FindingKind, Severity, sort_findings
from tracekit.findings.result import AnalyzerResult, section_of

__all__ = ["AnalyzerResult", "Finding", "FindingKind", "Severity", "section_of", "sort_findings"]
