"""The report (and a comparison, and `perfrun analyze`'s tables) as one JSON
document, for scripts and dashboards.

Numbers are raw (seconds, fractions, bytes, unrounded) under stable keys;
formatting is the reader's business. The report's part is always strict
JSON: a non-finite float, which `json.dumps` would write as the
non-standard `NaN` / `Infinity`, becomes null. The `results` that end a
run's report are the rank documents as their files hold them.
"""

from __future__ import annotations

import json
import math
from typing import Any

from perfrun.analysis.compare import Comparison
from perfrun.analysis.report import Report
from perfrun.analysis.window import TraceAnalysis


def finite(value: Any) -> Any:
    """`value` with every non-finite float made None (strict JSON)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def render_json(report: Report) -> str:
    """The report's numbers, then (when the report carries them) the merged
    results it was built from, as their files hold them."""
    doc = report.to_dict()
    results = doc.pop("results", None)
    doc = finite(doc)
    if results is None:
        return json.dumps(doc, indent=2, sort_keys=True, allow_nan=False)
    doc["results"] = results
    return json.dumps(doc, indent=2, sort_keys=True, default=str)


def render_comparison_json(comparison: Comparison) -> str:
    return json.dumps(comparison.to_dict(), indent=2, sort_keys=True)


def render_analysis_json(analysis: TraceAnalysis) -> str:
    return json.dumps(finite(analysis.to_dict()), indent=2, sort_keys=True, allow_nan=False)
