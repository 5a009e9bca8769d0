"""Offline HTML for ``kvlab report``: no script, style or font of a rendered notebook comes from the network.

nbconvert's ``lab`` template loads require.js and MathJax from cdnjs, the jupyter-widgets HTML manager from
jsDelivr (when the notebook carries widget state) and mermaid from cdnjs (when a diagram is present); plotly's
``notebook`` renderer adds a MathJax ``<script src>`` from cdnjs to every figure output. Without a network the
formulas stay raw ``$$…$$`` text and the page waits on requests that never finish.

The ``kvlab_report`` template (``templates/kvlab_report``) extends ``lab`` with those blocks emptied, and
typesets math with the KaTeX build vendored in ``assets/katex`` (MIT, see its README): ``katex.min.js``,
its auto-render extension and its CSS with the woff2 fonts as ``data:`` URLs are inlined into the page (only
when the notebook has math), so each page renders its formulas on its own, like its inlined plotly.js.
:func:`strip_remote_scripts` removes the ``<script src="https://…">`` tags outputs carry.
"""

from __future__ import annotations

import base64
import json
import re
from functools import lru_cache
from pathlib import Path

from kvlab.notebook_exec import ENV_TAG, PARAMETERS_TAG

HERE = Path(__file__).resolve().parent
KATEX_DIR = HERE / "assets" / "katex"
TEMPLATE_DIR = HERE / "templates"
TEMPLATE_NAME = "kvlab_report"

# Where Jupyter typesets math: markdown cells, text/latex outputs and text/html outputs (JupyterLab typesets
# rendered HTML too); KaTeX's auto-render skips <script>, <style>, <pre>, <code> and <textarea> inside them.
MATH_CONTAINERS = ".jp-RenderedMarkdown, .jp-RenderedLatex, .jp-RenderedHTML"
# KaTeX auto-render's defaults plus ``$…$`` inline math (Jupyter's convention); ``$$`` must precede ``$``.
_DELIMITERS = "[" + ", ".join(
    f"{{left: {json.dumps(left)}, right: {json.dumps(right)}, display: {str(display).lower()}}}"
    for left, right, display in (
        ("$$", "$$", True), ("\\[", "\\]", True),
        *((f"\\begin{{{env}}}", f"\\end{{{env}}}", True) for env in ("equation", "align", "alignat", "gather", "CD")),
        ("$", "$", False), ("\\(", "\\)", False))) + "]"

# A math delimiter in a markdown cell or a text/latex output (what would need typesetting).
_MATH = re.compile(r"\$[^$]|\\\(|\\\[|\\begin\{")

_REMOTE = r"(?:https?:)?//"
_REMOTE_SCRIPT = re.compile(r"<script\b[^>]*\bsrc\s*=\s*([\"'])\s*" + _REMOTE + r"[^\"']*\1[^>]*>\s*</script\s*>",
                            re.IGNORECASE)
# A request a page would make by itself: a script, stylesheet, image, frame or module import from a remote URL.
_REMOTE_LOAD = re.compile(
    r"<(?:script|img|iframe|embed|source|audio|video)\b[^>]*\bsrc\s*=\s*[\"']?\s*(" + _REMOTE + r"[^\"'\s>]+)"
    r"|<link\b[^>]*\bhref\s*=\s*[\"']?\s*(" + _REMOTE + r"[^\"'\s>]+)"
    r"|\bimport\s*\(?\s*[\"'](" + _REMOTE + r"[^\"']+)[\"']",
    re.IGNORECASE)


def strip_remote_scripts(html: str) -> str:
    """``html`` without ``<script src="http(s)://…"></script>`` tags (e.g. plotly's MathJax-from-cdnjs tag in
    each figure output: the report typesets with KaTeX and plotly's figures here carry no LaTeX)."""
    return _REMOTE_SCRIPT.sub("", html)


def remote_loads(html: str) -> list[str]:
    """The remote URLs a page would load by itself (scripts, stylesheets, images, frames, module imports);
    links a reader may click (``<a href>``) are not loads."""
    return [next(g for g in m.groups() if g) for m in _REMOTE_LOAD.finditer(html)]


def has_math(nb) -> bool:
    """Whether a markdown cell or a text/latex output holds a formula delimiter."""
    for cell in nb.cells:
        if cell.cell_type == "markdown" and _MATH.search(cell.source):
            return True
        for out in cell.get("outputs", []) if cell.cell_type == "code" else []:
            if "text/latex" in out.get("data", {}):
                return True
    return False


def _font_data_url(match: re.Match) -> str:
    name = match.group(1)
    path = KATEX_DIR / "fonts" / name
    if not path.is_file():
        raise FileNotFoundError(f"{KATEX_DIR / 'katex.min.css'}: font {name} is not vendored in {path.parent}")
    return f"url(data:font/woff2;base64,{base64.b64encode(path.read_bytes()).decode('ascii')})"


@lru_cache(maxsize=1)
def katex_head() -> str:
    """``<style>`` and ``<script>`` tags that typeset the page's math with KaTeX when it loads, all inline."""
    css = (KATEX_DIR / "katex.min.css").read_text(encoding="utf-8")
    css = re.sub(r",\s*url\(fonts/[^)]+\.(?:woff|ttf)\)\s*format\(\"(?:woff|truetype)\"\)", "", css)
    css = re.sub(r"url\(fonts/([^)]+\.woff2)\)", _font_data_url, css)
    if "url(fonts/" in css:
        raise ValueError(f"{KATEX_DIR / 'katex.min.css'}: a font URL kvlab does not inline is left: "
                         f"{css[css.index('url(fonts/'):][:80]}")
    katex_js = (KATEX_DIR / "katex.min.js").read_text(encoding="utf-8")
    auto_render = (KATEX_DIR / "contrib" / "auto-render.min.js").read_text(encoding="utf-8")
    init = (
        "document.addEventListener('DOMContentLoaded', function () {\n"
        f"  document.querySelectorAll({MATH_CONTAINERS!r}).forEach(function (el) {{\n"
        f"    renderMathInElement(el, {{delimiters: {_DELIMITERS}, throwOnError: false}});\n"
        "  });\n"
        "  document.body.setAttribute('data-kvlab-math', 'typeset');\n"
        "});"
    )
    return (f"<style type=\"text/css\">{css}</style>\n<script>{katex_js}</script>\n<script>{auto_render}</script>\n"
            f"<script>{init}</script>\n")


def exporter():
    """nbconvert's HTML exporter with kvlab's offline template."""
    from nbconvert import HTMLExporter
    from traitlets.config import Config

    # The cells kvlab.notebook_exec injects (KVLAB_DEVICE etc., parameters) are plumbing, not the notebook.
    config = Config({"TagRemovePreprocessor": {"enabled": True, "remove_cell_tags": [ENV_TAG, PARAMETERS_TAG]}})
    return HTMLExporter(template_name=TEMPLATE_NAME, extra_template_basedirs=[str(TEMPLATE_DIR)], config=config)


def render_notebook_html(nb) -> str:
    """``nb`` as one offline HTML page: KaTeX inlined when it has math, no CDN script tag."""
    resources = {"kvlab_math_head": katex_head() if has_math(nb) else ""}
    body, _ = exporter().from_notebook_node(nb, resources=resources)
    return body
