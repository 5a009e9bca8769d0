"""A radix cache drawn as a live icicle: ``RadixTreeWidget`` (any cache ``tree_frame`` reads) and
``TreeDemoPanel`` (buttons that step a :class:`kvlab.experiments.tree_demo.TreeDemo`).

Widths are tokens: a node is as wide as the cached sequences through it (``tree_frame``'s
``path_tokens``), so children fill their parent; colour is locked (red) / evictable leaf (green) /
shared inner node (blue). Hover gives the node's own tokens, a preview of its key, lock_ref, last
access time (the cache's logical clock) and hit count. ``refresh()`` reads the cache again and draws the
icicle whole (:func:`kvlab.viz.plots.radix_icicle` into a :class:`~kvlab.viz.live.LiveFigure`), so every view,
also one that attaches later, shows the tree as it is now.
"""

from __future__ import annotations

import html
from typing import Any

import ipywidgets as widgets
import pandas as pd

from kvlab.mem_cache.tree_view import tree_frame
from kvlab.viz import plots
from kvlab.viz.eviction_plots import MIN_LABEL_PX
from kvlab.viz.live import LiveFigure
from kvlab.viz.plots import (  # noqa: F401  (icicle_arrays: kept importable here)
    LOCKED_OUTLINE,
    RESIDENCY_COLOURS,
    RESIDENCY_NAMES,
    TREE_COLOURS,
    icicle_arrays,
)
from kvlab.viz.widgets import PanelShell


class RadixTreeWidget:
    """An icicle of ``cache`` that ``refresh()`` redraws, whole, from the cache's current state.

    ``max_nodes``: draw at most that many nodes, the first in pre-order (parents always come before
    their children, so what is drawn is a tree; the title says how many were left out).
    ``names``: first token -> label, as ``tree_frame`` takes it (e.g. ``TreeDemo.names``).
    """

    def __init__(self, cache: Any, *, max_nodes: int = 200, title: str | None = None,
                 names: dict[int, str] | None = None, height: int = 420) -> None:
        if not isinstance(max_nodes, int) or max_nodes < 2:
            raise ValueError(f"RadixTreeWidget: max_nodes must be an int >= 2 (the root and a node), got {max_nodes!r}")
        if not hasattr(cache, "root_node"):
            raise TypeError(f"RadixTreeWidget: cache must be a radix tree with a root_node (e.g. RadixCache), "
                            f"got {type(cache).__name__}")
        self.cache = cache
        self.max_nodes = max_nodes
        self.title = title or "Radix cache"
        # hybrid trees (SWA, Mamba) read best by position: "tokens 9–17 · state"
        self.names = names if names is not None or not _is_hybrid(cache) else "spans"
        self.height = height
        self.figure = LiveFigure()
        self.figure.add_class("kvlab-tree-fig")
        self.summary = widgets.HTML()
        self.summary.add_class("kvlab-tree-summary")
        legend = " ".join(f"<span style='color:{TREE_COLOURS[s]}'>■</span> {s}"
                          for s in ("locked", "evictable", "internal"))
        if _is_two_tier(cache):  # colour is where the KV lives; locked is an outline
            legend = " ".join(f"<span style='color:{RESIDENCY_COLOURS[r]}'>■</span> {RESIDENCY_NAMES[r]}"
                              for r in RESIDENCY_COLOURS)
            legend += (f" · <span style='border:2px solid {LOCKED_OUTLINE['color']};padding:0 4px'>outlined</span> "
                       "locked (a running request's path, or a copy in flight) · "
                       f"<span style='border:3px solid {CHANGED_OUTLINE['color']};padding:0 4px'>outlined</span> "
                       "changed by the last step (inserted, written, demoted or loaded back)")
        if _is_hybrid(cache):
            legend += (" · <span style='border:2px solid #222;padding:0 4px'>outlined</span> holds a recurrent "
                       "state · <span style='background:repeating-linear-gradient(45deg,#fff,#fff 2px,#999 2px,"
                       "#999 4px);padding:0 4px'>hatched</span> tombstone (state or window KV gone)")
        self.legend = widgets.HTML(f"<small>{legend} · width = tokens of the cached sequences through a node"
                                   f"</small>")
        self.legend.add_class("kvlab-tree-legend")
        self.widget = widgets.VBox([self.summary, self.legend, self.figure])
        self.widget.add_class("kvlab-tree-widget")
        self.frame: pd.DataFrame = pd.DataFrame()
        self.kv_tokens = 0  # KV tokens in the tree (each node's own, device or host) at the last drawing
        self.refresh()

    @property
    def node_count(self) -> int:
        """Nodes drawn (root included)."""
        return len(self.frame)

    def read_frame(self) -> tuple[pd.DataFrame, int]:
        """The cache as a table (``tree_frame`` plus ``preview``), cut to ``max_nodes``; and the node count."""
        frame, total, _ = self._read()
        return frame, total

    def _read(self) -> tuple[pd.DataFrame, int, int]:
        frame = tree_frame(self.cache, names=self.names)
        return frame.iloc[: self.max_nodes].reset_index(drop=True), len(frame), int(frame["tokens"].sum())

    @property
    def cached_tokens(self) -> int:
        """Tokens of the cached sequences the last drawing shows (the root's width)."""
        return int(self.frame["path_tokens"].iloc[0]) if len(self.frame) else 0

    def refresh(self, *, scale_tokens: int | None = None, gone: str = "evicted", since_kv_tokens: int | None = None,
                changed: tuple = ()) -> None:
        """Read the cache again and draw the icicle, its title and the summary from it. ``scale_tokens`` keeps the
        drawing at that width (the total before an eviction): what went is a pale "``gone``" block beside the tree,
        so the icicle does not stretch to hide how much was destroyed. The block is labelled with the KV tokens
        that went (``since_kv_tokens``, the tree's :attr:`kv_tokens` before, minus now), not its width: a width
        counts a shared prefix once per sequence through it. ``changed``: node ids outlined in
        :data:`CHANGED_OUTLINE` (what the last step did), unless locked (the red outline wins)."""
        frame, total, kv_tokens = self._read()
        cut = f" · first {len(frame)} of {total} nodes" if total > len(frame) else ""
        fig = plots.radix_icicle(frame, title=f"{self.title}{cut}", height=self.height)
        readable_labels(fig)
        if changed:
            outline_changed(fig, frame, changed)
        if scale_tokens is not None and len(frame):
            keep_scale(fig, scale_tokens, gone, None if since_kv_tokens is None else since_kv_tokens - kv_tokens)
        self.figure.draw(fig)
        self.frame = frame
        self.kv_tokens = kv_tokens
        self.summary.value = summary_html(self.cache, frame, total)


GONE_COLOUR = "#f2f2f2"
CHANGED_OUTLINE = dict(width=4, color="#ffbf00")


def outline_changed(fig, frame: pd.DataFrame, changed) -> None:
    """Outline the nodes ``changed`` (ids) in :data:`CHANGED_OUTLINE`; a locked node keeps its red outline."""
    trace = fig.data[0]
    ids = {int(i) for i in changed}
    widths, colours = list(trace.marker.line.width), list(trace.marker.line.color)
    for k, (node_id, status) in enumerate(zip(frame["id"], frame["status"])):
        if int(node_id) in ids and status != "locked":
            widths[k], colours[k] = CHANGED_OUTLINE["width"], CHANGED_OUTLINE["color"]
    trace.marker.line.width, trace.marker.line.color = widths, colours


def readable_labels(fig) -> None:
    """Labels at one readable size: plotly shrinks a label to fit its block (down to ~6 px on a narrow one);
    ``uniformtext`` hides those that would need less than ``MIN_LABEL_PX``."""
    fig.update_layout(uniformtext=dict(minsize=MIN_LABEL_PX, mode="hide"))


def keep_scale(fig, scale_tokens: int, gone: str = "evicted", gone_kv_tokens: int | None = None) -> None:
    """Widen the icicle's root to ``scale_tokens`` with a pale block for the tokens no longer in the tree. The block
    is as wide as the cached sequences' tokens that went (the icicle's unit); its label and hover give the KV tokens
    that went (``gone_kv_tokens``) when known, else that width."""
    trace = fig.data[0]
    values = list(trace.values)
    missing = int(scale_tokens) - int(values[0])
    if missing <= 0:
        return
    values[0] += missing
    colors = list(trace.marker.colors)
    kv = missing if gone_kv_tokens is None else int(gone_kv_tokens)
    width = (f"<br>drawn {missing:,} tokens wide: the cached sequences through them" if gone_kv_tokens is not None
             else "")
    trace.update(ids=[*trace.ids, "__gone__"], parents=[*trace.parents, trace.ids[0]], values=[*values, missing],
                 labels=[*trace.labels, f"{gone}: {kv:,} tokens"],
                 customdata=[*trace.customdata, [kv, gone, 0, 0, 0, 0, "(no longer cached)", width]])
    trace.marker.colors = [*colors, GONE_COLOUR]
    if trace.marker.pattern is not None and trace.marker.pattern.shape is not None:
        trace.marker.pattern.shape = [*trace.marker.pattern.shape, ""]
        trace.marker.line.width = [*trace.marker.line.width, 0.5]
        trace.marker.line.color = [*trace.marker.line.color, "#ffffff"]


def _is_hybrid(cache: Any) -> bool:
    return hasattr(cache, "mamba_pool") or hasattr(cache, "sliding_window_size")


def _is_two_tier(cache: Any) -> bool:
    """A ``HiRadixCache``: nodes may live on host too (``token_to_kv_pool_host``)."""
    return hasattr(cache, "token_to_kv_pool_host")


def summary_html(cache: Any, frame: pd.DataFrame, total_nodes: int) -> str:
    """One line of sizes; ``data-*`` attributes carry the numbers for tests and the browser (a two-tier tree adds
    ``data-host`` / ``data-host-only``: tokens with a host copy, and of those the ones on host only)."""
    evictable = int(cache.evictable_size()) if hasattr(cache, "evictable_size") else 0
    protected = int(cache.protected_size()) if hasattr(cache, "protected_size") else 0
    locked = int((frame["status"] == "locked").sum()) if len(frame) else 0
    host = ""
    if _is_two_tier(cache):
        host_tokens = int(cache.host_size())
        host_only = sum(len(n.key) for n in cache.nodes() if n is not cache.root_node and n.value is None)
        host = (f" data-host='{host_tokens}' data-host-only='{host_only}'",
                f" · host pool: {host_tokens:,} of {cache.token_to_kv_pool_host.size:,} tokens used, "
                f"{host_only:,} of them on host only")
    return (f"<div class='kvlab-tree-sizes' data-nodes='{total_nodes}' data-evictable='{evictable}' "
            f"data-protected='{protected}'{host[0] if host else ''}>{total_nodes - 1:,} nodes · "
            f"{evictable + protected:,} tokens cached{' on the device' if host else ''}: "
            f"{evictable:,} evictable, {protected:,} protected (locked by running requests, {locked} nodes)"
            f"{host[1] if host else ''}</div>")


class TreeDemoPanel:
    """Step a :class:`~kvlab.experiments.tree_demo.TreeDemo` with buttons and watch its tree change.

    Buttons (CSS classes): "next request" (``kvlab-tree-next``), "pressure event"
    (``kvlab-tree-pressure``), "reset" (``kvlab-tree-reset``: back to an empty tree); the eviction mode
    (``kvlab-tree-mode``) applies to the evictions from then on. Laid out by
    :class:`~kvlab.viz.widgets.PanelShell`: the controls, the busy line and the errors (``kvlab-errors``), then the
    results (the last steps, ``kvlab-tree-log``, and the tree), greyed out (``kvlab-stale``) from a click until the
    tree is redrawn. A step the demo refuses (no request left) leaves the tree as it is (it is still true) and
    says why in the errors; a drawing that fails hides the results.
    """

    def __init__(self, demo: Any = None, *, start_requests: int = 0, max_nodes: int = 200,
                 **demo_options: Any) -> None:
        from kvlab.experiments.shortfall_eviction import MODE_LABELS
        from kvlab.experiments.tree_demo import TreeDemo
        from kvlab.mem_cache.common import EVICTION_MODES

        self.demo = demo if demo is not None else TreeDemo(**demo_options)
        for _ in range(start_requests):  # so the first drawing already has a tree to look at
            self.demo.next_request()
        self.tree = RadixTreeWidget(self.demo.cache, max_nodes=max_nodes, names=self.demo.names,
                                    title="Radix cache of the demo")
        self.next_button = widgets.Button(description="next request", button_style="primary")
        self.pressure_button = widgets.Button(description="pressure event", button_style="warning")
        self.reset_button = widgets.Button(description="reset")
        self.mode = widgets.Dropdown(options=[(MODE_LABELS[m], m) for m in EVICTION_MODES],
                                     value=self.demo.mode, description="eviction")
        self.log = widgets.HTML()
        self.shell = PanelShell([self.log, self.tree.widget])
        self.status, self.errors = self.shell.status, self.shell.errors
        for w, css in ((self.next_button, "kvlab-tree-next"), (self.pressure_button, "kvlab-tree-pressure"),
                       (self.reset_button, "kvlab-tree-reset"), (self.mode, "kvlab-tree-mode"),
                       (self.log, "kvlab-tree-log")):
            w.add_class(css)
        self.next_button.on_click(self.shell.guard(lambda _b: self.next_request()))
        self.pressure_button.on_click(self.shell.guard(lambda _b: self.pressure_event()))
        self.reset_button.on_click(self.shell.guard(lambda _b: self.reset()))
        self.mode.observe(self.shell.guard(self._set_mode), names="value")
        self.controls = widgets.HBox([self.next_button, self.pressure_button, self.reset_button, self.mode],
                                     layout=widgets.Layout(flex_flow="row wrap"))
        self.widget = self.shell.box(self.controls)
        self.widget.add_class("kvlab-tree-demo-panel")
        self.shell.guard(self._draw)()

    def next_request(self):
        step = self.demo.next_request()
        self._draw()
        return step

    def pressure_event(self):
        before, kv_before = self.tree.cached_tokens, self.tree.kv_tokens
        step = self.demo.pressure_event()
        # drawn at the pre-event width: the pale block is what was evicted, labelled with its KV tokens
        self._draw(scale_tokens=before, since_kv_tokens=kv_before)
        return step

    def reset(self) -> None:
        self.demo.reset()
        self.tree.cache = self.demo.cache
        self._draw()

    def _set_mode(self, change) -> None:
        self.demo.mode = change["new"]
        with self.shell.showing():
            self._draw_log()  # the log names the mode; the tree is as it was

    def _draw(self, scale_tokens: int | None = None, since_kv_tokens: int | None = None) -> None:
        changed = getattr(self.demo.history[-1], "changed", ()) if self.demo.history else ()
        with self.shell.showing():
            self.tree.refresh(scale_tokens=scale_tokens, gone="evicted by the pressure event",
                              since_kv_tokens=since_kv_tokens, changed=changed)
            self.next_button.disabled = self.demo.done
            self._draw_log()

    def _draw_log(self) -> None:
        steps = self.demo.history[-4:]
        rows = "".join(f"<li>{html.escape(s.text())}</li>" for s in reversed(steps))
        head = (f"{self.demo.requests_run} of {len(self.demo.requests)} requests run · "
                f"{len(self.demo.history)} steps · mode {self.demo.mode}")
        self.log.value = (f"<div data-steps='{len(self.demo.history)}' data-mode='{html.escape(self.demo.mode)}'>"
                          f"{html.escape(head)}<ul style='margin:2px 0'>{rows}</ul></div>")


class HostTierPanel(TreeDemoPanel):
    """:class:`TreeDemoPanel` on a two-tier cache (:class:`kvlab.experiments.host_tier.HostTierDemo`): the icicle
    is coloured by residency (device only / device and host / host only, locked outlined red, what the last step
    changed outlined gold) and a write-policy menu (``kvlab-tree-write-policy``) replays the same steps (requests
    and pressure events) under another ``--hicache-write-policy``, so the trees compare on one history. The tree
    comes first under the controls, the log under it, so the tree is in view at 720 px."""

    def __init__(self, demo: Any = None, *, start_requests: int = 0, max_nodes: int = 200,
                 **demo_options: Any) -> None:
        from kvlab.experiments.host_tier import POLICIES, HostTierDemo

        demo = demo if demo is not None else HostTierDemo(**demo_options)
        super().__init__(demo, start_requests=start_requests, max_nodes=max_nodes)
        self.tree.title = "Two-tier radix cache of the demo (HiCache)"
        self.write_policy = widgets.Dropdown(options=list(POLICIES), value=self.demo.write_policy,
                                             description="write policy", style={"description_width": "initial"})
        self.write_policy.add_class("kvlab-tree-write-policy")
        self.write_policy.observe(self.shell.guard(self._set_policy), names="value")
        self.controls.children = (*self.controls.children, self.write_policy)
        self.shell.results.children = (self.tree.widget, self.log)
        self.widget.add_class("kvlab-host-tier-panel")
        self.shell.guard(self._draw)()

    def _set_policy(self, change) -> None:
        self.demo.replay(change["new"])
        self.tree.cache = self.demo.cache
        self._draw()
