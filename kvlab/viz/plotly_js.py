"""plotly.js as text: plotly.py's own bundled copy, which ``kvlab app --workshop`` serves beside the dashboard so a
page fetches it once as a file (kvlab.app.write_dashboard)."""

from __future__ import annotations


def plotly_js() -> str:
    from plotly.offline import get_plotlyjs

    return get_plotlyjs()
