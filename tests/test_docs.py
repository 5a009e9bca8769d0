"""The repository's own docs (docs/*.md) are what code, tests and notebooks cite, and every citation leads somewhere.

- No file cites the planning documents that lived outside the repository (the design, semantics, testing, style and
  SGLang digest notes in ``../shared``); their content is in docs/ now. Real data in ``../shared/real-data`` is
  another matter: tests read it where it exists (tests/shared_data.py).
- Every ``docs/<page>.md`` and ``docs/<page>.md#<section>`` named anywhere in the repository exists, the section as
  a heading of that page (GitHub's anchor for it).
- Every relative link inside docs/ (and in README.md) leads to a file that exists, and to a heading of it when it
  names one.
"""

from __future__ import annotations

import re
import subprocess
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
THIS = Path(__file__).resolve()

# The outside documents, by name (case-sensitive: docs/testing.md is not TESTING.md).
OUTSIDE_DOCS = re.compile(r"\b(?:DESIGN|SEMANTICS|TESTING|STYLE|SGLANG_MEMCACHE)\.md\b|\bSGLANG_MEMCACHE\b"
                          r"|\bshared/(?:tools|hooks|seeds)/")
DOC_REFERENCE = re.compile(r"(?<![\w./-])docs/([\w.-]+\.md)(?:#([\w-]+))?")
MD_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$")


def _repo_files() -> list[Path]:
    """Tracked files plus new ones git does not ignore (the tree a commit would hold)."""
    try:
        out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, capture_output=True,
                             text=True, check=True).stdout
        paths = [ROOT / p for p in out.split("\0") if p]
    except (OSError, subprocess.CalledProcessError):  # not a git checkout: every file but .git's
        paths = [p for p in ROOT.rglob("*") if ".git" not in p.relative_to(ROOT).parts]
    return sorted(p for p in paths if p.is_file())


def _text(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError):
        return None  # binary (fonts, pickles, safetensors)


@cache
def _text_files() -> tuple[tuple[Path, str], ...]:
    files = []
    for path in _repo_files():
        text = _text(path)
        if text is not None:
            files.append((path, text))
    return tuple(files)


def github_anchor(heading: str) -> str:
    """The id GitHub gives a heading: lower case, punctuation dropped (``-`` and ``_`` kept), spaces to ``-``."""
    text = re.sub(r"`|\*\*|__", "", heading.strip().lower())
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link in a heading keeps its text
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


@cache
def anchors(page: Path) -> frozenset[str]:
    """Every heading anchor of a markdown page (outside code fences), duplicates numbered as GitHub does."""
    seen: dict[str, int] = {}
    found = set()
    in_fence = False
    for line in page.read_text(encoding="utf-8").splitlines():
        if FENCE.match(line):
            in_fence = not in_fence
            continue
        m = None if in_fence else HEADING.match(line)
        if m:
            slug = github_anchor(m.group(2))
            n = seen.get(slug, 0)
            seen[slug] = n + 1
            found.add(slug if n == 0 else f"{slug}-{n}")
    return frozenset(found)


def _line_of(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def test_docs_pages_exist():
    assert {p.name for p in DOCS.glob("*.md")} >= {"README.md", "architecture.md", "semantics.md", "testing.md",
                                                    "contributing.md"}


def test_github_anchor_matches_githubs_rule():
    assert github_anchor("Worked example: Llama-3-8B") == "worked-example-llama-3-8b"
    assert github_anchor("Add a `LiveFigure` panel") == "add-a-livefigure-panel"
    assert github_anchor("Hybrid trees: SWA and Mamba") == "hybrid-trees-swa-and-mamba"
    assert github_anchor("vLLM, for contrast") == "vllm-for-contrast"


def test_no_file_cites_the_documents_outside_the_repository():
    offenders = []
    for path, text in _text_files():
        if path == THIS:
            continue
        for m in OUTSIDE_DOCS.finditer(text):
            offenders.append(f"{path.relative_to(ROOT)}:{_line_of(text, m.start())}: {m.group(0)}")
    assert not offenders, ("cite docs/<page>.md#<section> instead of the documents outside the repository:\n"
                           + "\n".join(offenders))


def test_every_cited_docs_page_and_section_exists():
    cited = 0
    broken = []
    for path, text in _text_files():
        for m in DOC_REFERENCE.finditer(text):
            page, section = DOCS / m.group(1), m.group(2)
            where = f"{path.relative_to(ROOT)}:{_line_of(text, m.start())}: {m.group(0)}"
            cited += 1
            if not page.is_file():
                broken.append(f"{where} (no such page)")
            elif section and section not in anchors(page):
                broken.append(f"{where} (no such section; {page.name} has: {', '.join(sorted(anchors(page)))})")
    assert cited, "no file cites docs/: the scan found nothing to check"
    assert not broken, "\n".join(broken)


def _doc_pages() -> list[Path]:
    """docs/*.md and the README that links them."""
    return sorted(DOCS.rglob("*.md")) + [ROOT / "README.md"]


@pytest.mark.parametrize("page", _doc_pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_links_inside_docs_lead_somewhere(page: Path):
    text = page.read_text(encoding="utf-8")
    broken = []
    for m in MD_LINK.finditer(text):
        target = m.group(1)
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        file_part, _, section = target.partition("#")
        resolved = (page.parent / file_part).resolve() if file_part else page
        where = f"{page.relative_to(ROOT)}:{_line_of(text, m.start())}: ({target})"
        if not resolved.exists():
            broken.append(f"{where} (no such file)")
        elif section and resolved.suffix == ".md" and section not in anchors(resolved):
            broken.append(f"{where} (no such section)")
    assert not broken, "\n".join(broken)


def test_readme_links_the_docs():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "](docs/README.md)" in readme, "README.md should link docs/README.md"


# ---- the code docs/architecture.md names exists where it says --------------------------------------------
KVLAB = ROOT / "kvlab"
CODE_SPAN = re.compile(r"`([^`\n]+)`")
QUALIFIED = re.compile(r"(?P<file>[\w/]+\.py)::(?P<name>[\w.]+)")  # device/budget.py::kv_budget(...)
DOTTED = re.compile(r"kvlab(?:\.\w+)+")  # kvlab.device.get_device(...)
FILE = re.compile(r"(?:[\w*]+/)*[\w*]+\.(?:py|ipynb)|(?:[\w]+/)+")  # device/replay*.py, model/loader.py, sched/
CLASS_LIKE = re.compile(r"[A-Z][A-Za-z0-9]*[a-z][A-Za-z0-9]*")  # SimResult, KVBudget (not KVLAB_DATA_DIR)
NAME_LIST = re.compile(r"\s*\(((?:\s*`_?[A-Za-z]\w*`\s*,?)+)\)")  # right after a span: (`run`, `compare`)
FILE_AFTER = re.compile(r"\s*\(`([^`]+)`")  # right after a name: (`device/simulated.py` ...


def _module_of(file: str) -> str | None:
    """``device/budget.py``, ``kvlab/device/budget.py``, ``device/caching_allocator/`` or a file name found once in
    kvlab/ -> the module's dotted name; None when no file (or more than one) matches."""
    rel = file.removeprefix("kvlab/").rstrip("/")
    matches = [KVLAB / rel] if "/" in rel else sorted(KVLAB.rglob(rel))
    if len(matches) != 1 or not matches[0].exists():
        return None
    parts = matches[0].relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _lookup(module: str, dotted: str = "") -> str | None:
    """None when ``module`` imports and has the attribute chain ``dotted``, its first link a class or function
    defined in ``module`` itself (or in a module of that package), not one it imports; else what is wrong."""
    import importlib
    import inspect

    try:
        obj = importlib.import_module(module)
    except ImportError as exc:
        return f"{module} does not import ({exc})"
    for i, attr in enumerate(filter(None, dotted.split("."))):
        if not hasattr(obj, attr):
            return f"{module}.{'.'.join(dotted.split('.')[:i + 1])} does not exist"
        obj = getattr(obj, attr)
        home = obj.__module__ if i == 0 and (inspect.isclass(obj) or inspect.isfunction(obj)) else module
        if home != module and not home.startswith(f"{module}."):
            return f"{attr} is defined in {home}, not in {module}"
    return None


def _dotted_lookup(dotted: str) -> str | None:
    """``kvlab.a.b.name``: the longest prefix that is a module of kvlab/, then attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts), 1, -1):
        module = ".".join(parts[:cut])
        path = ROOT.joinpath(*parts[:cut])
        if path.with_suffix(".py").is_file() or (path / "__init__.py").is_file():
            return _lookup(module, ".".join(parts[cut:]))
    return f"{dotted}: no module of kvlab/ starts it"


@cache
def _names_defined_in_kvlab() -> frozenset[str]:
    import ast

    names = set()
    for path in KVLAB.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
    return frozenset(names)


def architecture_name_errors(text: str) -> list[str]:
    """Every code name in ``text`` (docs/architecture.md) that does not exist where the text says. A name says
    where it is in one of these ways, and is looked up there (the module imported, the attributes followed):

    - ``path.py::Name.attr`` (path from kvlab/; arguments may follow the name), or ``kvlab.module.Name``;
    - names in parentheses right after a file, ``path.py`` (``a``, ``b``), are that module's; right after
      ``path.py::Name`` (``a``, ``b``), they are Name's attributes;
    - a name right before a file in parentheses, ``Name`` (``path.py``), is that module's.

    Besides: every file or directory named (``model/loader.py``, ``sched/``, ``device/replay*.py``, a file name
    alone) exists in kvlab/, the repository or by name somewhere in it, and every other class-like name
    (``SimResult``) is defined somewhere in kvlab/.
    """
    repo_names = {p.name for p in _repo_files()}
    errors = []
    for m in CODE_SPAN.finditer(text):
        span, after, where = m.group(1), text[m.end():], f"docs/architecture.md:{_line_of(text, m.start())}"
        owner = None  # the module (and attribute chain) names listed right after this span belong to
        if q := QUALIFIED.match(span):
            module = _module_of(q.group("file"))
            problem = _lookup(module, q.group("name")) if module else f"no file kvlab/{q.group('file')}"
            owner = (module, q.group("name"))
        elif d := DOTTED.fullmatch(span.split("(")[0]):
            problem = _dotted_lookup(d.group(0))
        elif FILE.fullmatch(span):
            problem = None
            if not any(any(base.glob(span.rstrip("/"))) for base in (KVLAB, ROOT)) and span not in repo_names:
                problem = f"no file {span} in kvlab/ or the repository"
            elif span.endswith(".py") and "*" not in span:
                owner = (_module_of(span), "")
        elif (f := FILE_AFTER.match(after)) and FILE.fullmatch(f.group(1)) and re.fullmatch(r"_?[A-Za-z]\w*", span):
            module = _module_of(f.group(1))
            problem = _lookup(module, span) if module else None  # the file itself is checked as its own span
        elif CLASS_LIKE.fullmatch(span):
            problem = None if span in _names_defined_in_kvlab() else f"{span} is defined nowhere in kvlab/"
        else:
            continue
        if problem:
            errors.append(f"{where}: `{span}`: {problem}")
        if owner and owner[0] and (listed := NAME_LIST.match(after)):
            for name in re.findall(r"`(\w+)`", listed.group(1)):
                if problem := _lookup(owner[0], f"{owner[1]}.{name}"):
                    errors.append(f"{where}: `{name}` (listed after `{span}`): {problem}")
    return errors


def test_every_name_in_architecture_md_exists_where_it_says():
    text = (DOCS / "architecture.md").read_text(encoding="utf-8")
    assert len(QUALIFIED.findall(text)) >= 10, "the scan found too few `path.py::Name` references to mean anything"
    errors = architecture_name_errors(text)
    assert not errors, "docs/architecture.md names code that is not where it says:\n" + "\n".join(errors)


def test_the_architecture_name_check_catches_wrong_places():
    """The check above fails on the mistakes it is for (the first one was in docs/architecture.md)."""
    assert architecture_name_errors("`sched/scheduler.py::SimResult.totals`")
    assert architecture_name_errors("`sched/scheduler.py::Scheduler` (`_match_everything`)")
    assert architecture_name_errors("`SimulatedGPU` (`device/cuda.py`)")
    assert architecture_name_errors("`kvlab.device.no_such_function()`")
    assert architecture_name_errors("`model/no_such_file.py`")
    assert not architecture_name_errors("`sched/result.py::SimResult.totals` and `SimulatedGPU` (`device/simulated.py`)")


def test_readme_lists_every_registered_eviction_policy():
    from kvlab.mem_cache.evict_policy import EVICTION_POLICIES

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    listed = re.findall(r"`--policy ([\w|]+)`", readme)
    assert listed, "README.md no longer shows `--policy a|b|...`"
    for policies in listed:
        assert policies.split("|") == list(EVICTION_POLICIES), (
            f"README.md lists --policy {policies}; kvlab registers {'|'.join(EVICTION_POLICIES)}")
