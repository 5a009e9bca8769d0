"""`kvlab report`: executed notebooks, an offline HTML site, PNGs and summary.json equal to the experiments."""

from __future__ import annotations

import html
import json
import os
import re
import struct
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from kvlab.report import (
    MARKER,
    Manifest,
    ReportError,
    prepare_out_dir,
    select_notebooks,
    share_plotly_js,
    strip_build_paths,
)
from kvlab.viz.export import PLOTLY_JS_MARKER

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _kvlab(*args: str, timeout: int = 900, progress: bool = False) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kvlab.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env={**__import__("os").environ, "KVLAB_PROGRESS": "1" if progress else "0"})


REPORT_STDERR: dict[str, str] = {}


@pytest.fixture(scope="module")
def report_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("report") / "site"
    proc = _kvlab("report", "--out", str(out), "--notebooks", "01", "--device", "sim:h200", progress=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    REPORT_STDERR["01"] = proc.stderr
    return out


@pytest.mark.slow
def test_a_progress_line_per_notebook_and_no_transport_warning(report_dir: Path):
    err = REPORT_STDERR["01"]
    assert re.search(r"^\[1/1\] 01_kv_pool_sizing … \d+ s$", err, re.M), err[-2000:]
    assert re.search(r"^\[summary\] summary\.json … \d+ s$", err, re.M)
    assert "eavesdropping" not in err and "without encryption" not in err


@pytest.mark.slow
def test_pages_share_one_plotly_js_and_show_no_build_machine_path(report_dir: Path):
    page = (report_dir / "html" / "01_kv_pool_sizing.html").read_text()
    shared = report_dir / "html" / "plotly.min.js"
    assert shared.is_file() and shared.stat().st_size > 3_000_000
    assert PLOTLY_JS_MARKER not in page  # not inlined: 4.8 MB less per page
    assert 'src="plotly.min.js"' in page
    assert len(page.encode()) < 2_000_000, len(page.encode())
    for root in (str(Path(__file__).resolve().parents[1]), str(Path.home())):
        assert root + "/" not in page, root
    manifest = json.loads((report_dir / MARKER).read_text())
    assert "html/plotly.min.js" in manifest["files"]
    # a live panel in a static page says its controls do nothing here (notebook 01's §2 panel)
    assert "Static copy of a live panel" in page and "kvlab app 01" in page


def test_share_plotly_js_replaces_each_inlined_copy_and_nothing_else():
    js = "/* plotly.js v9 */ window.Plotly = {};"
    page = f"<p>a</p><script>{js}</script><div>b</div><script type='text/javascript'>{js}</script><i>{js}</i>"
    shared = share_plotly_js(page, js)
    assert shared.count('src="plotly.min.js"') == 2 and shared.endswith(f"<i>{js}</i>")
    assert shared.startswith("<p>a</p><script") and "<div>b</div>" in shared


def test_strip_build_paths_leaves_paths_relative_to_the_checkout():
    roots = {"/work/wt/x/": "", "/root/": "~/"}
    page = "config /work/wt/x/data/examples/models/q/config.json; cache /root/.cache/k"
    assert strip_build_paths(page, roots) == "config data/examples/models/q/config.json; cache ~/.cache/k"


@pytest.mark.slow
def test_index_links_each_rendered_notebook(report_dir: Path):
    index = (report_dir / "index.html").read_text()
    assert "href='html/01_kv_pool_sizing.html'" in index and "data-ok='true'" in index
    assert (report_dir / "html" / "01_kv_pool_sizing.html").is_file()
    assert "02_shortfall_eviction" not in index  # --notebooks 01 ran only 01
    assert (report_dir / MARKER).is_file()


@pytest.mark.slow
def test_executed_copy_has_outputs_and_the_device_env(report_dir: Path):
    nb = nbformat.read(report_dir / "notebooks" / "01_kv_pool_sizing.ipynb", as_version=4)
    assert "injected-env" in nb.cells[0].metadata["tags"] and "sim:h200" in nb.cells[0].source
    code = [c for c in nb.cells[1:] if c.cell_type == "code"]
    assert all(c.execution_count is not None for c in code)
    assert sum(bool(c.outputs) for c in code) >= len(code) // 2
    assert not [o for c in code for o in c.outputs if o.output_type == "error"]
    # the source notebook is untouched (committed without outputs)
    source = nbformat.read(Path(__file__).resolve().parents[1] / "notebooks" / "01_kv_pool_sizing.ipynb", 4)
    assert all(not c.get("outputs") for c in source.cells if c.cell_type == "code")
    # ... and the injected cell is plumbing: the executed copy keeps it, the page a reader sees does not
    page = re.sub(r"<[^>]+>", "", html.unescape((report_dir / "html" / "01_kv_pool_sizing.html").read_text()))
    assert "no_gc, with_gc = kv_pool_sizing.compare" in page
    assert "Environment injected by" not in page
    assert "os.environ['KVLAB_DEVICE'] = 'sim:h200'" not in page


@pytest.mark.slow
def test_html_embeds_plotly_figures_and_plotly_js_offline(report_dir: Path):
    page = (report_dir / "html" / "01_kv_pool_sizing.html").read_text()
    assert page.count("plotly-graph-div") >= 2  # the panel's timelines and waterfall, from the widget state
    assert "window.__kvlab_define" in page and "Plotly" in page  # plotly.js from the report, not from a CDN
    assert re.findall(r"<script[^>]+src=[\"']([^\"']*plotly[^\"']*)", page) == ["plotly.min.js"]
    assert "kvlab-verdict-box" in page  # the panel's HTML widgets are shown too


def _chromium_or_skip() -> None:
    if not os.access("/usr/bin/chromium", os.X_OK):
        if os.environ.get("KVLAB_REQUIRE_BROWSER") == "1":
            pytest.fail("chromium not found at /usr/bin/chromium (KVLAB_REQUIRE_BROWSER=1)")
        pytest.skip("chromium not found at /usr/bin/chromium: apt-get install -y chromium")


LOCAL_SCHEMES = ("file:", "data:", "blob:", "about:")
OFFLINE_CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                         "--disable-background-networking", "--disable-component-update", "--disable-sync",
                         "--disable-dev-shm-usage"]


def _open_offline(path: Path, check, screenshot: Path | None = None) -> None:
    """Open ``path`` in chromium with every non-local request aborted and counted (``page.on("request")``),
    then ``check(page, remote_requests, page_errors)``. A thread of its own: pytest-playwright's session
    (the browser tests) may already hold this thread's event loop, and the sync API refuses to start inside
    a running loop."""
    from concurrent.futures import ThreadPoolExecutor

    from playwright.sync_api import sync_playwright

    def run() -> None:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=OFFLINE_CHROMIUM_ARGS)
            try:
                context = browser.new_context(viewport={"width": 1280, "height": 900})
                context.route("**/*", lambda r: r.continue_() if r.request.url.startswith(LOCAL_SCHEMES)
                              else r.abort())
                page = context.new_page()
                remote: list[str] = []
                errors: list[str] = []
                page.on("request", lambda r: None if r.url.startswith(LOCAL_SCHEMES) else remote.append(r.url))
                page.on("pageerror", lambda e: errors.append(str(e)))
                page.goto(path.as_uri(), wait_until="load")
                check(page, remote, errors)
                if screenshot is not None:
                    page.screenshot(path=str(screenshot), full_page=True)
            finally:
                browser.close()

    with ThreadPoolExecutor(max_workers=1) as pool:
        pool.submit(run).result()


@pytest.mark.slow
@pytest.mark.browser
def test_html_page_draws_its_plots_and_formulas_with_the_network_cut(report_dir: Path, tmp_path: Path):
    """Open the page in chromium with every non-local request aborted: the plots draw, the formulas are
    typeset by KaTeX (no raw ``$$`` left in the visible text) and the page asked for nothing off the machine."""
    _chromium_or_skip()

    def check(page, remote, errors) -> None:
        page.wait_for_function("() => document.querySelectorAll('.js-plotly-plot .main-svg').length >= 2",
                               timeout=60_000)
        page.wait_for_function("() => document.body.getAttribute('data-kvlab-math') === 'typeset'", timeout=30_000)
        assert page.evaluate("() => typeof window.Plotly") == "object"
        assert not [e for e in errors if "Plotly" in e], errors
        # notebook 01's budget formula, typeset: KaTeX's HTML with its MathML twin, and no error box
        assert page.locator(".katex-display .katex-html").count() >= 1
        assert r"max\_total\_num\_tokens" in page.locator(".katex-display annotation").first.text_content()
        assert page.locator(".katex-error").count() == 0
        text = page.evaluate("() => document.body.innerText")
        assert "$$" not in text and "\\text{rest}" not in text
        assert errors == [], errors
        assert remote == [], f"requests off the machine: {remote}"

    _open_offline(report_dir / "html" / "01_kv_pool_sizing.html", check, tmp_path / "01.png")


def _figure_notebook(markdown: str) -> nbformat.NotebookNode:
    """A notebook as a headless run leaves it: a markdown cell and a figure shown through plotly's ``notebook``
    renderer (``PLOTLY_RENDERER=plotly_mimetype+notebook``), whose HTML asks cdnjs for MathJax."""
    import plotly.graph_objects as go
    import plotly.io as pio

    fig = go.Figure(go.Scatter(x=[0, 1, 2], y=[3, 1, 2]), layout_title_text="three points")
    bundle = pio.renderers["notebook"].to_mimebundle(fig.to_dict())
    assert re.search(r"<script src=\"https://cdnjs[^\"]+mathjax", bundle["text/html"])  # what a run leaves
    nb = nbformat.v4.new_notebook()
    code = nbformat.v4.new_code_cell("fig.show()", execution_count=1)
    code.outputs = [nbformat.v4.new_output("display_data", data={**bundle, "text/plain": "Figure"})]
    nb.cells = [nbformat.v4.new_markdown_cell(markdown), code]
    return nb


def test_remote_loads_finds_scripts_styles_images_and_imports_not_links():
    from kvlab.viz.offline import remote_loads

    page = ("<script src='https://cdn.example/a.js'></script><link rel=stylesheet href=\"//cdn.example/b.css\">"
            "<img src=http://x.example/c.png><script type=module>import \"https://cdn.example/d.mjs\"</script>"
            "<a href='https://plotly.com/'>plotly</a><script src='../local.js'></script>")
    assert remote_loads(page) == ["https://cdn.example/a.js", "//cdn.example/b.css", "http://x.example/c.png",
                                  "https://cdn.example/d.mjs"]


def test_rendered_page_loads_nothing_remote_and_inlines_katex_only_when_needed():
    from kvlab.report import render_html
    from kvlab.viz.offline import remote_loads

    page = render_html(_figure_notebook("Budget: $$\\text{rest} = a - b$$ and inline $x^2$."))
    assert remote_loads(page) == []  # no require.js, MathJax, widget manager or mermaid from a CDN
    assert "renderMathInElement" in page and "data:font/woff2;base64," in page  # KaTeX and its fonts inline
    assert "url(fonts/" not in page
    assert page.count("* plotly.js v") == 1  # the figure gets plotly.js, once
    plain = render_html(_figure_notebook("No formulas here, only a price of 5 dollars."))
    assert "renderMathInElement" not in plain and remote_loads(plain) == []


@pytest.mark.browser
def test_a_plotly_figure_and_inline_math_render_offline(tmp_path: Path):
    """A plain ``fig.show()`` output (what panels emit headless) and ``$…$`` math, with the network cut."""
    _chromium_or_skip()
    from kvlab.report import render_html

    path = tmp_path / "page.html"
    path.write_text(render_html(_figure_notebook("Inline $x^2 + y$ and display $$\\frac{a}{b}$$.")), encoding="utf-8")

    def check(page, remote, errors) -> None:
        page.wait_for_function("() => document.querySelectorAll('.js-plotly-plot .main-svg').length >= 1",
                               timeout=30_000)
        page.wait_for_function("() => document.body.getAttribute('data-kvlab-math') === 'typeset'", timeout=30_000)
        assert page.locator(".jp-RenderedMarkdown .katex").count() == 2  # inline and display
        assert page.locator(".katex-display").count() == 1 and page.locator(".katex-error").count() == 0
        assert "$" not in page.locator(".jp-RenderedMarkdown").first.inner_text()
        assert errors == [] and remote == [], (errors, remote)

    _open_offline(path, check)


@pytest.mark.slow
def test_summary_equals_the_experiments_with_the_notebooks_settings(report_dir: Path):
    from kvlab.experiments import kv_pool_sizing, shortfall_eviction

    summary = json.loads((report_dir / "summary.json").read_text())
    no_gc, with_gc = kv_pool_sizing.compare("sglang-pr-4xh200")
    f1 = summary["finding1_kv_pool_sizing"]
    for arm, result in (("without_gc", no_gc), ("with_gc", with_gc)):
        data = result.to_json()
        for key in ("max_total_num_tokens", "accepted", "error", "rest_bytes", "available_bytes"):
            assert f1[arm][key] == data[key], (arm, key)
    assert f1["without_gc"]["accepted"] is False and f1["with_gc"]["accepted"] is True
    # the devices are named: the notebooks' (--device) and the preset's simulated ranks finding 1 ran on
    assert summary["device"] == {"name": "sim:h200", "description": "simulated NVIDIA H200 141 GB HBM3e (sim:h200)"}
    assert f1["device"] == "sim:h200-80gb-cap" and f1["device_description"].startswith("4 × simulated H200 capped")
    assert "finding1_on_this_gpu" not in summary  # a simulated report measures no GPU
    # finding 2 is notebook 02 section 2's workload and pool, named in full
    f2 = summary["finding2_shortfall_eviction"]
    panel = shortfall_eviction.PANEL_DEFAULTS
    assert (f2["workload"], f2["seed"], f2["kv_tokens"], f2["page_size"], f2["policy"]) == (
        panel.workload, panel.seed, panel.kv_tokens, panel.page_size, panel.policy)
    requests = shortfall_eviction.load_requests(workload=f2["workload"], seed=f2["seed"], overrides=f2["overrides"])
    comparison = shortfall_eviction.compare(requests, kv_tokens=f2["kv_tokens"], page_size=f2["page_size"],
                                            policy=f2["policy"])
    for arm, result in (("shortfall", comparison.shortfall), ("full", comparison.full)):
        totals = result.totals()
        for key in ("hit_rate", "over_evicted_tokens", "evicted_tokens", "prefill_tokens_computed", "requests"):
            assert f2[arm][key] == totals[key], (arm, key)
    assert f2["shortfall"]["over_evicted_tokens"] == 0 < f2["full"]["over_evicted_tokens"]
    assert summary["notebooks"]["01_kv_pool_sizing"]["ok"] is True


def _parameters(path: Path) -> dict:
    """The literal settings of a notebook's cell tagged ``parameters`` (papermill's convention), by name."""
    import ast

    import jupytext

    cells = [c for c in jupytext.read(path).cells if "parameters" in c.metadata.get("tags", [])]
    assert len(cells) == 1, f"{path.name}: {len(cells)} cells tagged parameters"
    return {target.id: ast.literal_eval(node.value)
            for node in ast.parse(cells[0].source).body if isinstance(node, ast.Assign)
            for target in node.targets if isinstance(target, ast.Name)}


def _calls(path: Path, name: str, names: dict | None = None) -> list[tuple[list, dict]]:
    """(positional, keyword) literal arguments of every ``<anything>.name(...)`` call in a notebook's py twin
    (a bare name found in ``names`` read as its value, e.g. a parameter; ``dict(k=v)`` read as a dict; other
    non-literal arguments as their source text)."""
    import ast

    names = names or {}
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == name:
            def value(n):
                if isinstance(n, ast.Name) and n.id in names:
                    return names[n.id]
                if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "dict" and not n.args:
                    return {k.arg: value(k.value) for k in n.keywords}  # dict(a=1) as {"a": 1}
                try:
                    return ast.literal_eval(n)
                except ValueError:
                    return ast.unparse(n)
            found.append(([value(a) for a in node.args], {k.arg: value(k.value) for k in node.keywords}))
    return found


def test_summary_settings_are_the_notebooks_own(repo_root: Path):
    """summary.json reports what the notebooks show: the same presets, workload and pool as their cells."""
    from kvlab import report

    nb01, nb02 = repo_root / "notebooks" / "01_kv_pool_sizing.py", repo_root / "notebooks" / "02_shortfall_eviction.py"
    compares = _calls(nb01, "compare", names=_parameters(nb01))  # the presets are parameters: read their values
    assert ([report.SUMMARY_PRESET], {}) in compares  # section 1
    assert ([report.SUMMARY_GPU_PRESET], {"device": "cuda"}) in compares  # section 4, on a GPU
    source = nb02.read_text()
    assert "settings = shortfall_eviction.PANEL_DEFAULTS" in source  # section 2's setting is the panel's
    assert (["settings"], {}) in _calls(nb02, "panel_comparison")


def test_the_report_device_reaches_notebook_01_through_its_parameters_cell(repo_root: Path, monkeypatch):
    """The report's env cell goes first; notebook 01's parameters cell is its first code cell and leaves the
    device to ``KVLAB_DEVICE``, so ``--device`` still decides (papermill-style injected parameters would follow
    the parameters cell and win over both)."""
    import jupytext

    from kvlab.device import resolve_device_name

    code = [c for c in jupytext.read(repo_root / "notebooks" / "01_kv_pool_sizing.py").cells if c.cell_type == "code"]
    assert "parameters" in code[0].metadata.get("tags", [])
    monkeypatch.setenv("KVLAB_DEVICE", "sim:l4")
    namespace: dict = {}
    exec(code[0].source, namespace)
    assert resolve_device_name(namespace["DEVICE"]) == "sim:l4"


@pytest.mark.slow
def test_index_states_the_headline_numbers_in_words(report_dir: Path):
    summary = json.loads((report_dir / "summary.json").read_text())
    index = (report_dir / "index.html").read_text()
    assert "&quot;" not in index and '"max_total_num_tokens"' not in index  # no JSON dump
    assert index.count("<table class='kvlab-headline'>") == 3  # finding 1, finding 2, HiCache's host tier
    assert "Notebooks ran on <b>simulated NVIDIA H200 141 GB HBM3e (sim:h200)</b>" in index
    f1, f2 = summary["finding1_kv_pool_sizing"], summary["finding2_shortfall_eviction"]
    bug, fix = f1["without_gc"]["max_total_num_tokens"], f1["with_gc"]["max_total_num_tokens"]
    for text in (f"{bug:,} tokens", f"{fix:,} tokens", f"+{fix - bug:,} tokens", "refused", "accepted",
                 f1["device_description"]):
        assert html.escape(text) in index, text
    hit_bug, hit_fix = f2["full"]["hit_rate"], f2["shortfall"]["hit_rate"]
    over = f2["full"]["over_evicted_tokens"]
    for text in (f"{100 * hit_bug:.2f} %", f"{100 * hit_fix:.2f} %",
                 f"+{100 * (hit_fix - hit_bug):.2f} percentage points", f"{over:,}", f"−{over:,}",
                 f"{f2['kv_tokens']:,}-token KV pool, {f2['page_size']:,}-token pages",
                 "seed 0, num_groups=64, prompts_per_group=8"):
        assert html.escape(text) in index, text
    assert index.index("(the bug)") < index.index("(the fix)") < index.index("difference (fix − bug)")


def _summary(hit_bug: float, hit_fix: float, prefill_bug: int, prefill_fix: int) -> dict:
    arm = {"max_total_num_tokens": 0, "max_req_input_len": None, "available_bytes": 3 * 2**30, "rest_bytes": 0,
           "kv_pool_bytes": 0, "prompt_tokens": 4000, "accepted": False, "error": "Not enough memory"}
    f1 = {"source": "s", "preset": "p", "model": "m", "tp_size": 1, "device": "sim:l4", "device_description": "d",
          "without_gc": arm, "with_gc": {**arm, "max_total_num_tokens": 12_345, "max_req_input_len": 8_186,
                                          "available_bytes": 5 * 2**30, "accepted": True, "error": None}}
    sim = {"over_evicted_tokens": 0, "evicted_tokens": 10, "requests": 4}
    f2 = {"source": "s", "workload": "w", "seed": 1, "overrides": {}, "kv_tokens": 1_000, "device_description": "d",
          "shortfall": {**sim, "hit_rate": hit_fix, "prefill_tokens_computed": prefill_fix},
          "full": {**sim, "hit_rate": hit_bug, "prefill_tokens_computed": prefill_bug, "over_evicted_tokens": 7}}
    return {"finding1_kv_pool_sizing": f1, "finding2_shortfall_eviction": f2}


def test_headlines_word_the_direction_of_each_difference():
    from kvlab.report import headlines

    pool, eviction = headlines(_summary(0.5, 0.25, 100, 1_100))
    assert "instead of 0" in pool.sentence and "(" not in pool.sentence.split("instead of 0")[1][:3]  # no ratio of 0
    assert pool.rows[0][1:] == ("0 tokens", "12,345 tokens", "+12,345 tokens")
    assert pool.rows[2][1:] == ("3.00 GiB", "5.00 GiB", "+2.00 GiB")
    assert pool.note == "SGLang's message — without gc.collect(): Not enough memory"
    assert "lowers the prefix-cache hit rate from 50.00 % to 25.00 % (−25.00 percentage points)" in eviction.sentence
    assert "computed 1,000 fewer prefill tokens" in eviction.sentence
    assert eviction.rows[0] == ("prefix-cache hit rate", "50.00 %", "25.00 %", "−25.00 percentage points")
    assert ("prefill tokens computed", "100", "1,100", "+1,000") in eviction.rows
    same = headlines(_summary(0.5, 0.5, 100, 100))[1]
    assert "leaves the prefix-cache hit rate" in same.sentence and "as many prefill tokens" in same.sentence


def test_describe_device_names_simulated_presets_and_refuses_unknown_ones():
    from kvlab.report import describe_device

    assert describe_device("sim:h100-80g") == "simulated NVIDIA H100 80 GB HBM3 (SXM) (sim:h100-80g)"
    with pytest.raises(ValueError, match="unknown device preset 'b300'"):
        describe_device("sim:b300")


@pytest.mark.slow
def test_pngs_are_legible_images_captioned_in_words(report_dir: Path):
    from kvlab.viz.export import FIGURE_CAPTIONS, PNG_SCALE, PNG_WIDTH

    pngs = sorted((report_dir / "figures").glob("*.png"))
    assert {p.stem for p in pngs} == set(FIGURE_CAPTIONS)
    for path in pngs:
        data = path.read_bytes()
        assert data[:8] == PNG_SIGNATURE, path
        width, height = struct.unpack(">II", data[16:24])  # IHDR
        assert width == PNG_WIDTH * PNG_SCALE == 2400 and 600 <= height <= 1400, (path, width, height)  # up to three rows
        assert len(data) > 20_000, path  # a drawn figure, not an empty canvas
    index = (report_dir / "index.html").read_text()
    for path in pngs:
        caption = html.escape(FIGURE_CAPTIONS[path.stem])
        assert f"<img src='figures/{path.name}' alt='{caption}'>" in index
        assert f"<figcaption>{caption}</figcaption>" in index and f"<figcaption>{path.stem}" not in index


def _notebook(path: Path, sources: list[str]) -> None:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(s) for s in sources]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)


@pytest.mark.slow
def test_a_failing_notebook_is_named_and_marked_and_the_others_still_written(tmp_path: Path):
    nbs = tmp_path / "nbs"
    nbs.mkdir()
    _notebook(nbs / "01_good.ipynb", ["import os\nprint('device', os.environ['KVLAB_DEVICE'])"])
    _notebook(nbs / "02_bad.ipynb", ["x = 1", "raise ValueError('broken on purpose')", "print('never')"])
    _notebook(nbs / "03_after.ipynb", ["print('still ran')"])
    out = tmp_path / "site"
    proc = _kvlab("report", "--out", str(out), "--notebook-dir", str(nbs), "--no-png", "--device", "sim:h100-80g")
    assert proc.returncode == 1
    assert "02_bad.ipynb: cell 1 failed" in proc.stderr and "broken on purpose" in proc.stderr
    index = (out / "index.html").read_text()
    assert "data-notebook='02_bad' data-ok='false'" in index and "FAILED" in index
    assert "data-notebook='01_good' data-ok='true'" in index and "data-notebook='03_after' data-ok='true'" in index
    good = nbformat.read(out / "notebooks" / "01_good.ipynb", 4)
    assert "device sim:h100-80g" in good.cells[1].outputs[0]["text"]
    bad = nbformat.read(out / "notebooks" / "02_bad.ipynb", 4)
    assert bad.cells[2].outputs[0]["output_type"] == "error"  # partial copy kept for debugging
    assert (out / "html" / "02_bad.html").is_file() and (out / "html" / "03_after.html").is_file()
    assert json.loads((out / "summary.json").read_text())["notebooks"]["02_bad"]["ok"] is False


@pytest.mark.slow
def test_refuses_a_directory_that_is_not_a_report(tmp_path: Path):
    user = tmp_path / "mine"
    user.mkdir()
    (user / "thesis.tex").write_text("precious")
    proc = _kvlab("report", "--out", str(user), "--notebooks", "01")
    assert proc.returncode == 2 and "not a previous kvlab report" in proc.stderr and "--force" in proc.stderr
    assert (user / "thesis.tex").read_text() == "precious" and sorted(p.name for p in user.iterdir()) == ["thesis.tex"]


@pytest.mark.slow
def test_refuses_a_file_and_an_unknown_notebook(tmp_path: Path):
    target = tmp_path / "a-file"
    target.write_text("x")
    proc = _kvlab("report", "--out", str(target))
    assert proc.returncode == 2 and "is not a directory" in proc.stderr
    proc = _kvlab("report", "--out", str(tmp_path / "new"), "--notebooks", "99")
    assert proc.returncode == 2 and "no notebook matches '99'" in proc.stderr
    assert not (tmp_path / "new").exists()


def test_a_previous_report_is_cleared_but_nothing_else(tmp_path: Path):
    out = prepare_out_dir(tmp_path / "site")
    (out / "html").mkdir()
    (out / "html" / "old.html").write_text("old")
    (out / "index.html").write_text("old")
    (out / "html" / "theirs.html").write_text("a page someone put beside the report's")
    (out / "summary.json").write_text("{}")
    Manifest(out).record(out / "html" / "old.html", out / "index.html", out / "summary.json")
    (out / "summary.json").write_text('{"edited": "by hand since"}')
    prepare_out_dir(out)  # ours: allowed, and the old pages are gone
    assert not (out / "html" / "old.html").exists() and not (out / "index.html").exists()
    assert (out / "html" / "theirs.html").is_file()  # not in the manifest: never deleted
    assert (out / "summary.json").read_text() == '{"edited": "by hand since"}'  # changed since: theirs now
    with pytest.raises(ReportError, match=r"summary\.json already there and not written by kvlab report"):
        prepare_out_dir(out, planned=["index.html", "summary.json"])  # and never overwritten either
    assert json.loads((out / MARKER).read_text()) == {"kvlab_report_manifest": 1, "files": {}}
    forced = tmp_path / "forced"
    forced.mkdir()
    (forced / "keep.txt").write_text("k")
    with pytest.raises(ReportError):
        prepare_out_dir(forced)
    prepare_out_dir(forced, force=True)
    assert (forced / "keep.txt").read_text() == "k"  # --force writes beside, never deletes the user's files
    prepare_out_dir(forced)  # now a report folder, whose manifest proves nothing of keep.txt
    assert (forced / "keep.txt").read_text() == "k"


def _user_tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.slow
def test_force_then_a_plain_report_keeps_the_users_notebooks_html_and_figures(tmp_path: Path):
    """``--force`` writes beside a user's files; the next report (no ``--force``) deletes only what the first one
    wrote, not the user's ``notebooks/``, ``html/`` and ``figures/`` (kvlab <= this change deleted all three)."""
    nbs = tmp_path / "nbs"
    nbs.mkdir()
    _notebook(nbs / "01_tiny.ipynb", ["print('tiny')"])
    out = tmp_path / "mine"
    for name, data in {"notebooks/analysis.ipynb": b"{}", "html/talk.html": b"<p>talk</p>",
                       "figures/plot.png": b"\x89PNG mine", "thesis.tex": b"precious"}.items():
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_bytes(data)
    before = _user_tree(out)
    for extra in (["--force"], []):
        proc = _kvlab("report", "--out", str(out), "--notebook-dir", str(nbs), "--no-png", "--device", "sim:h100-80g",
                      *extra)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert (out / "html" / "01_tiny.html").is_file() and (out / "notebooks" / "01_tiny.ipynb").is_file()
        assert {k: v for k, v in _user_tree(out).items() if k in before} == before
    manifest = json.loads((out / MARKER).read_text())["files"]
    assert sorted(manifest) == ["html/01_tiny.html", "html/plotly.min.js", "index.html", "notebooks/01_tiny.ipynb",
                                "summary.json"]


@pytest.mark.slow
def test_a_report_never_writes_into_the_notebooks_folder(tmp_path: Path, monkeypatch):
    """``kvlab report --out . --force --notebook-dir notebooks`` would execute each notebook over its own source and
    then delete it on the next run: refused before anything runs, the sources untouched."""
    (tmp_path / "notebooks").mkdir()
    _notebook(tmp_path / "notebooks" / "01_tiny.ipynb", ["print('tiny')"])
    before = _user_tree(tmp_path)
    monkeypatch.chdir(tmp_path)
    for out, nb_dir in ((".", "notebooks"), ("notebooks", "notebooks"), ("site", "site/html")):
        if nb_dir == "site/html":
            (tmp_path / "site" / "html").mkdir(parents=True)
            _notebook(tmp_path / "site" / "html" / "01_tiny.ipynb", ["print('tiny')"])
            before = _user_tree(tmp_path)
        proc = subprocess.run([sys.executable, "-m", "kvlab.cli", "report", "--out", out, "--force", "--notebook-dir",
                               nb_dir, "--no-png"], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                              env={**os.environ, "KVLAB_PROGRESS": "0",
                                   "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(__file__).parents[1]),
                                                                               os.environ.get("PYTHONPATH")]))})
        assert proc.returncode == 2, proc.stderr
        assert f"--notebook-dir {nb_dir}: the notebooks' own folder is where this report would write" in proc.stderr
        assert _user_tree(tmp_path) == before


@pytest.mark.slow
def test_a_file_the_report_would_write_over_stops_it_first(tmp_path: Path):
    nbs = tmp_path / "nbs"
    nbs.mkdir()
    _notebook(nbs / "01_tiny.ipynb", ["print('tiny')"])
    out = tmp_path / "mine"
    (out / "html").mkdir(parents=True)
    (out / "index.html").write_text("my home page")
    (out / "html" / "01_tiny.html").write_text("my notes")
    proc = _kvlab("report", "--out", str(out), "--notebook-dir", str(nbs), "--no-png", "--force")
    assert proc.returncode == 2
    assert "index.html, html/01_tiny.html already there and not written by kvlab report" in proc.stderr
    assert (out / "index.html").read_text() == "my home page" and (out / "html" / "01_tiny.html").read_text() == "my notes"
    assert sorted(p.name for p in out.iterdir()) == ["html", "index.html"]  # nothing written, not even a manifest


def test_select_notebooks_by_number_or_stem(tmp_path: Path):
    for name in ("00_intro", "01_kv_pool_sizing", "02_shortfall_eviction"):
        _notebook(tmp_path / f"{name}.ipynb", ["1"])
    assert [p.stem for p in select_notebooks(tmp_path, ["02", "00_intro"])] == ["02_shortfall_eviction", "00_intro"]
    assert len(select_notebooks(tmp_path)) == 3


def test_static_panels_show_dropdowns_and_toggle_buttons_by_their_selected_label():
    """Selection widgets keep an index, not a value, in saved widget state: the static copy names the choice."""
    from kvlab.viz.export import _widget_html

    states = {
        "box": {"model_name": "HBoxModel", "state": {"children": ["IPY_MODEL_dd", "IPY_MODEL_tb"], "_dom_classes": []}},
        "dd": {"model_name": "DropdownModel", "state": {"description": "preset", "index": 1,
                                                         "_options_labels": ["llama-8b-l4", "sglang-pr-4xh200"]}},
        "tb": {"model_name": "ToggleButtonsModel", "state": {"description": "eviction", "index": 0,
                                                              "_options_labels": ["shortfall (the fix)", "full (the bug)"]}},
    }
    page = _widget_html("box", states)
    assert "preset: <b>sglang-pr-4xh200</b>" in page and "eviction: <b>shortfall (the fix)</b>" in page
