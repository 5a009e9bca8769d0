"""SGLang's and vLLM's KV budgets side by side: one waterfall each, same GiB axis, the pools in the titles.

``engine_waterfalls(comparison)`` draws an :class:`~kvlab.serving.engine_compare.EngineComparison`: every term
of both rules as a bar (hover: where the number comes from), the KV budget as the total bar, and the tokens
each engine gets above its panel. ``gap_bars(comparison)`` draws what the gap is made of, in tokens.
"""

from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from kvlab.viz.theme import BUG_COLOUR, FIX_COLOUR, TEMPLATE

ENGINE_NAMES = {"sglang": "SGLang", "vllm": "vLLM"}
ENGINE_COLOURS = {"sglang": FIX_COLOUR, "vllm": "#ff7f0e"}
_WRAP = 14


def _wrap(name: str, width: int = _WRAP) -> str:
    words, lines, line = name.split(), [], ""
    for word in words:
        if line and len(line) + 1 + len(word) > width:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}".strip()
    return "<br>".join([*lines, line])


def mark_assumed(fig: go.Figure, assumed, width: int = 150) -> go.Figure:
    """Say under ``fig`` what its starred numbers rest on (``assumed``: the inputs, in words), where any, in lines
    of at most ``width`` characters (the note starts at the plot area's left edge: a figure with wide axis labels
    has less room)."""
    under = list(dict.fromkeys(assumed))
    if under:
        text = _wrap("* assumed, not read: rests on " + "; ".join(under), width)
        bottom = fig.layout.margin.b if fig.layout.margin.b is not None else 80
        # below the whole bottom margin (tick labels, axis title), which grows by the note's lines
        fig.add_annotation(text=text, xref="paper", yref="paper", x=0, y=0, yshift=-bottom, xanchor="left",
                           yanchor="top", showarrow=False, align="left", font=dict(size=11, color="#8a5a00"))
        fig.update_layout(margin=dict(b=bottom + 16 * (text.count("<br>") + 1) + 8),
                          height=(fig.layout.height or 450) + 16 * (text.count("<br>") + 1) + 8)
    return fig


def _star(term) -> str:
    return "*" if getattr(term, "assumed", ()) else ""


def _title(budget, logged) -> str:
    name = ENGINE_NAMES[budget.engine]
    seen = f" (log {logged:,})" if logged is not None else ""
    return f"<b>{name}</b>: {budget.tokens:,} tokens{seen}"


def engine_waterfalls(comparison, height: int = 440) -> go.Figure:
    """Both budgets as waterfalls in two panels sharing the GiB axis."""
    budgets = (comparison.sglang, comparison.vllm)
    fig = make_subplots(rows=1, cols=2, shared_yaxes=True, horizontal_spacing=0.04,
                        subplot_titles=[_title(b, comparison.logged.get(b.engine)) for b in budgets])
    for col, budget in enumerate(budgets, start=1):
        colour = ENGINE_COLOURS[budget.engine]
        values = [round(t.gib, 4) for t in budget.terms]
        fig.add_trace(go.Waterfall(
            name=ENGINE_NAMES[budget.engine], x=[_wrap(t.name) for t in budget.terms], y=values,
            measure=[t.measure for t in budget.terms], customdata=[[t.name, t.how] for t in budget.terms],
            text=[(f"{v:+.2f}" if t.measure == "relative" else f"{v:.2f}") + _star(t)
                  for v, t in zip(values, budget.terms)],
            textposition="outside", cliponaxis=False,
            hovertemplate="<b>%{customdata[0]}</b>: %{y:.2f} GiB<br>%{customdata[1]}<extra></extra>",
            connector=dict(line=dict(color="#999")), decreasing=dict(marker=dict(color="#bbbbbb")),
            increasing=dict(marker=dict(color=colour)), totals=dict(marker=dict(color=colour)),
        ), row=1, col=col)
    top = max(max(t.gib for t in b.terms) for b in budgets)
    fig.update_yaxes(title_text="GiB per GPU", range=[0, top * 1.12], row=1, col=1)
    for col, budget in enumerate(budgets, start=1):  # eight bars in half a figure: slant their labels
        fig.update_xaxes(tickangle=-30 if len(budget.terms) > 6 else 0, tickfont=dict(size=11), row=1, col=col)
    fig.update_layout(template=TEMPLATE, height=height, showlegend=False, margin=dict(t=70, l=60, r=20, b=80),
                      title=dict(text=f"Same model, GPU and TP {comparison.tp_size}: KV budget per GPU", y=0.98))
    return mark_assumed(fig, (a for b in budgets for t in b.terms for a in t.assumed))


def gap_bars(comparison, height: int = 380) -> go.Figure:
    """The token gap (SGLang − vLLM) split by kind of term; bars sum to the gap."""
    rows = comparison.gap
    colours = [BUG_COLOUR if r["tokens"] > 0 else FIX_COLOUR for r in rows]
    widest = max(abs(r["tokens"]) for r in rows) or 1
    fig = go.Figure(go.Bar(
        x=[r["tokens"] for r in rows], y=[_wrap(r["what"], 34) for r in rows], orientation="h",
        marker=dict(color=colours), text=[f"{r['tokens']:+,}" + ("*" if r.get("assumed") else "") for r in rows],
        # labels of long bars inside (a negative one outside would run into the axis labels)
        textposition=["inside" if abs(r["tokens"]) > 0.3 * widest else "outside" for r in rows],
        insidetextanchor="middle", cliponaxis=False, textangle=0,
        customdata=[[r["what"], r["gib"]] for r in rows],
        hovertemplate="%{customdata[0]}: %{x:+,} tokens (%{customdata[1]:+.2f} GiB)<extra></extra>"))
    gap = comparison.sglang.tokens - comparison.vllm.tokens
    # a short negative bar's label sits left of it: the axis reaches far enough left to hold it inside the plot
    # (else it runs into the bar names)
    low = min(0, *(r["tokens"] for r in rows))
    high = max(0, *(r["tokens"] for r in rows))
    fig.update_layout(template=TEMPLATE, height=height, title=f"Where the gap of {gap:+,} tokens comes from",
                      xaxis=dict(title="tokens (SGLang − vLLM)", range=[low - 0.18 * widest, high + 0.05 * widest]),
                      yaxis=dict(autorange="reversed"), margin=dict(t=50, l=60, r=80, b=50))
    return mark_assumed(fig, (a for r in rows for a in r.get("assumed", ())), width=80)
