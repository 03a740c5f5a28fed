"""Reports: lay analysis.json out as a self-contained HTML page and a Markdown summary (no metrics here)."""

from reports.diff_report import render_diff_html, render_diff_markdown
from reports.html_report import render_html, render_html_parts, write_parts
from reports.markdown import render_markdown

__all__ = ["render_html", "render_html_parts", "write_parts", "render_markdown", "render_diff_html", "render_diff_markdown"]
