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
