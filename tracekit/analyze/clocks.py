"""Section `clocks` and the `clock_skew` finding: what matching's clock estimate (derive/clocks.py) found.

The estimate itself is a derived fact (derive/matching.py computes it while it matches collectives); this
analyzer publishes it and warns when large offsets could not be corrected. The section's shape is in
derive/clocks.py's docstring.
"""

from __future__ import annotations

from dataclasses import dataclass

from tracekit.derive.clocks import ClockConfig
from tracekit.derive.matching import MatchingResult
from tracekit.findings.evidence import Evidence
from tracekit.findings.finding import Finding, FindingKind, Severity
from tracekit.findings.result import AnalyzerResult


@dataclass(frozen=True)
class ClocksResult(AnalyzerResult):
    pass


def analyze_clocks(matching: MatchingResult | None) -> ClocksResult:
    """Publish what matching estimated, and warn when large offsets could not be corrected."""
    est = matching.clocks if matching is not None else None
    if est is None:
        return ClocksResult(section={"method": "none", "reference_rank": None, "ranks": [],
                                     "log_to_trace": []})
    section = dict(est)
    findings = []
    warn_ns = ClockConfig().warn_offset_ns
    bad = [r for r in section["ranks"] if r["status"] == "uncorrectable" and abs(r["offset_ns"]) >= warn_ns]
    if bad:
        worst = max(bad, key=lambda r: abs(r["offset_ns"]))
        findings.append(Finding(
            kind=FindingKind.CLOCK_SKEW, severity=Severity.WARNING,
            summary=(f"clocks of {len(bad)} rank(s) disagree by up to {abs(worst['offset_ns']) / 1e6:.2f} ms "
                     "and the offsets could not be estimated consistently; cross-rank skew numbers are unreliable"),
            ranks=tuple(r["rank"] for r in bad), dim=None,
            evidence=Evidence(details={"offsets": [{k: r[k] for k in ("rank", "offset_ns", "mad_ns", "instances")}
                                                   for r in bad]}),
            recommendation="Record clock anchors (tracekit record writes them to manifest.json) or sync host clocks (chrony/PTP).",
            est_saving_ns=0))
    unaligned = [x["rank"] for x in section.get("log_to_trace", []) if x["method"] == "unaligned"]
    if unaligned:
        section["note"] = (f"comms-log times of ranks {unaligned} could not be put on the trace clock; "
                           "straggler causes there are not attributed")
    return ClocksResult(findings=findings, section=section)
