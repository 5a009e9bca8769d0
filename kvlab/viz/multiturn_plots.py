"""The multi-turn benchmark's rounds: a published table's per-round hit rates beside kvlab's
(``kvlab simulate --compare-table``, :mod:`kvlab.experiments.published_tables`). Pure: a comparison in, a
``plotly.graph_objects.Figure`` out; the numbers drawn are the comparison's rows, the same the CLI prints."""

from __future__ import annotations

import plotly.graph_objects as go

from kvlab.viz.theme import TEMPLATE


def rounds_vs_published(comparison) -> go.Figure:
    """Measured and simulated "Cache Hit Rate" per round, the device pool's source (given, derived or assumed) in
    the title and the table's notes (inferred fields, defaults) as an annotation."""
    data = comparison.as_dict()
    rounds = [row["round"] for row in data["rounds"]]
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=rounds, y=[row["measured_cache_hit_rate"] for row in data["rounds"]],
                             mode="lines+markers", name="measured (published)",
                             hovertemplate="round %{x}<br>measured %{y:.6f}<extra></extra>"))
    fig.add_trace(go.Scatter(x=rounds, y=[row["simulated_cache_hit_rate"] for row in data["rounds"]],
                             mode="lines+markers", name="simulated (kvlab)", line=dict(dash="dash"),
                             hovertemplate="round %{x}<br>simulated %{y:.6f}<extra></extra>"))
    pool = data["device_pool"]
    fig.update_layout(
        template=TEMPLATE, xaxis_title="round", yaxis_title="cache hit rate (Σ cached / Σ prompt)",
        title=dict(text=f"{comparison.plan.title}<br><sup>device pool {data['kv_tokens']:,} tokens: "
                        f"{pool[:150]}</sup>", x=0.0),
        margin=dict(t=90, b=40 + 16 * min(len(data["notes"]), 8)))
    notes = "<br>".join(data["notes"][:8])
    if notes:
        fig.add_annotation(text=notes, xref="paper", yref="paper", x=0, y=-0.18, yanchor="top", showarrow=False,
                           align="left", font=dict(size=10))
    return fig
