"""One look for every kvlab figure: a plotly template, the two arms' colours and the words for block states.

Importing :mod:`kvlab.viz` registers the ``"kvlab"`` template and makes it plotly's default, so a figure looks
the same in JupyterLab, Voila, the static report and its PNGs, whichever function built it. The words for
allocator block states come from :data:`kvlab.device.snapshot.STATE_NAMES` (tables, legends and the CLI share them).
"""

from __future__ import annotations

import plotly.graph_objects as go
import plotly.io as pio

from kvlab.device.snapshot import STATE_NAMES

TEMPLATE = "kvlab"
FONT = "Inter, 'Segoe UI', 'Helvetica Neue', Arial, sans-serif"
# The fix and the bug, everywhere: finding 1's arms (with / without gc.collect()) and finding 2's modes.
FIX_COLOUR, BUG_COLOUR = "#1f77b4", "#d62728"
STATE_COLOURS = {"active_allocated": "#1f77b4", "active_pending_free": "#ff7f0e", "inactive": "#cccccc"}
STATE_STYLE = {state: (STATE_NAMES[state], colour) for state, colour in STATE_COLOURS.items()}

_template = go.layout.Template(pio.templates["plotly_white"])
_template.layout.update(
    font=dict(family=FONT, size=13, color="#222"),
    title=dict(font=dict(size=16), x=0.01, xanchor="left"),
    colorway=[FIX_COLOUR, BUG_COLOUR, "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#7f7f7f", "#17becf"],
    hoverlabel=dict(font=dict(family=FONT, size=12)),
    legend=dict(font=dict(size=12)),
    separators=".,",  # 1,234.5: thousands separated as in the tables and the CLI
)
_template.layout.xaxis.update(title=dict(font=dict(size=13)), automargin=True)
_template.layout.yaxis.update(title=dict(font=dict(size=13)), automargin=True)
pio.templates[TEMPLATE] = _template
pio.templates.default = TEMPLATE

__all__ = ["BUG_COLOUR", "FIX_COLOUR", "STATE_COLOURS", "STATE_STYLE", "TEMPLATE"]
