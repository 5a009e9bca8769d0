"""Plots (pure DataFrame -> plotly Figure) and widget panels (thin controllers).

The only layer of kvlab that imports plotly or ipywidgets.
"""
