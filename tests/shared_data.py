"""Where the project's shared real data is: ``../shared`` beside the repository root.

``../shared/real-data/README.md`` says what is there and where it came from. CI and the project's machines
have the folder; a user's clone has not, so tests that read it skip with a reason when :func:`shared_dir`
is None. Never copy these files into the repository.
"""

from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
SKIP_REASON = ("../shared/real-data/snapshots is absent (only CI and the project's machines have it; a clone has "
               "not)")


def shared_dir() -> Path | None:
    """``../shared`` beside the repository root (README in ../shared/real-data: CI has it, a user's clone
    does not). In a linked git worktree (``.git`` is a file naming the main checkout's ``.git/worktrees/X``)
    the folder sits beside the main checkout instead."""
    candidates = [REPO_ROOT.parent / "shared"]
    dot_git = REPO_ROOT / ".git"
    if dot_git.is_file():
        gitdir = dot_git.read_text().partition("gitdir:")[2].strip()
        if gitdir:
            candidates.append(Path(gitdir).resolve().parents[2].parent / "shared")
    return next((c for c in candidates if (c / "real-data" / "snapshots").is_dir()), None)


def real_snapshots() -> list[Path]:
    """The ``_dump_snapshot`` pickles recorded on real GPUs, or [] without ``../shared``."""
    shared = shared_dir()
    return sorted((shared / "real-data" / "snapshots").glob("*.pickle")) if shared else []
