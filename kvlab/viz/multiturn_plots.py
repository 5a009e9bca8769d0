"""The multi-turn benchmark's rounds: a published table's per-round hit rates beside kvlab's
(``kvlab simulate --compare-table``, :mod:`kvlab.experiments.published_tables`). Pure: a comparison in, a
``plotly.graph_objects.Figure`` out; the numbers drawn are the comparison's rows, the same the CLI prints."""

from __future__ import annotations

import plotly.graph_objects as go

from kvlab.viz.theme import TEMPLATE


def _lines(text: str, width: int) -> list[str]:
    """``text`` in lines of at most ``width`` characters (so a long note wraps instead of running off the figure)."""
    import textwrap

    return textwrap.wrap(text, width) or [""]


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
    pool = _lines(f"device pool {data['kv_tokens']:,} tokens: {data['device_pool']}", 110)
    notes = [line for note in data["notes"][:8] for line in _lines(note, 120)]
    fig.update_layout(
        template=TEMPLATE, xaxis_title="round", yaxis_title="cache hit rate (Σ cached / Σ prompt)",
        title=dict(text=f"{comparison.plan.title}<br><sup>{'<br>'.join(pool)}</sup>", x=0.0),
        height=380 + 15 * (len(notes) + len(pool)), margin=dict(t=70 + 15 * len(pool), b=75 + 15 * len(notes)))
    if notes:  # below the x axis's tick labels and title (pixels, whatever the plot's height)
        fig.add_annotation(text="<br>".join(notes), xref="paper", yref="paper", x=0, y=0, yanchor="top",
                           yshift=-60, showarrow=False, align="left", font=dict(size=10))
    return fig


TIER_COLOURS = {"device": "#2ca02c", "host": "#1f77b4", "storage": "#ff7f0e"}  # the residency colours of notebook 07


def round_tier_bars(frame, title: str = "Where each round's hits came from") -> go.Figure:
    """Stacked bars per round: device, host and storage hits as shares of the round's prompt tokens (the stack's
    top is the script's "Cache Hit Rate"), the no-eviction ideal as a marker. ``frame``:
    ``multiturn_tiers.tier_rounds(result)`` (its token counts in the hover)."""
    rounds = [int(r) for r in frame["round"]]
    fig = go.Figure()
    for tier, colour in TIER_COLOURS.items():
        tokens = [int(t) for t in frame[f"{tier}_hit_tokens"]]
        shares = [t / p for t, p in zip(tokens, frame["prompt_tokens"])]
        fig.add_trace(go.Bar(x=rounds, y=shares, name=f"{tier} hits", marker_color=colour, customdata=tokens,
                             hovertemplate=f"round %{{x}}<br>{tier}: %{{y:.4f}} (%{{customdata:,}} tokens)"
                                           "<extra></extra>"))
    fig.add_trace(go.Scatter(x=rounds, y=list(frame["ideal_hit_rate"]), mode="markers", name="ideal (no eviction)",
                             marker=dict(symbol="line-ew-open", size=22, color="#333333", line_width=2),
                             hovertemplate="round %{x}<br>ideal %{y:.6f}<extra></extra>"))
    fig.update_layout(template=TEMPLATE, barmode="stack", title=dict(text=title, x=0.0), xaxis_title="round",
                      yaxis=dict(title="share of the round's prompt tokens", range=[0, 1], tickformat=".0%"),
                      xaxis=dict(dtick=1), legend=dict(orientation="h", y=-0.2), height=420,
                      margin=dict(t=40 + 24 * (title.count("<br>") + 1), l=60, r=20, b=90))
    return fig
