"""Plots (pure DataFrame -> plotly Figure) and widget panels (thin controllers).

The only layer of kvlab that imports plotly or ipywidgets.
"""

from kvlab.viz import theme  # noqa: E402,F401  (registers the "kvlab" plotly template as the default)
