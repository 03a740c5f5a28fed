"""The typed analysis document (msgspec structs), its conversion from the engine's dict, its schema.

    doc = document_of(analysis)        # dict (or JSON bytes, or a document) -> AnalysisDocument
    doc.sections.pipeline.measured_bubble
"""

from tracekit.document.convert import (DocumentMismatch, as_document, as_section, decode_document, document_bytes,
                                        document_of, to_builtins)
from tracekit.document.model import (ANALYSIS_SCHEMA, SECTION_NAMES, AnalysisDocument, FindingDoc,
                                      RankBreakdown, Sections)

__all__ = ["ANALYSIS_SCHEMA", "SECTION_NAMES", "AnalysisDocument", "DocumentMismatch", "FindingDoc",
           "RankBreakdown", "Sections", "as_document", "as_section", "decode_document", "document_bytes", "document_of",
           "to_builtins"]
