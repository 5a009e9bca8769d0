"""Where ``../shared`` (real data recorded outside the project; its README is ../shared/real-data/README.md) is.

CI has ``../shared`` beside the repository root; a user's clone does not, and tests that need it skip with a
message saying so (:data:`SKIP_REASON`). In a linked git worktree (``.git`` is a file naming the main
checkout's ``.git/worktrees/X``) the folder sits beside the main checkout instead. Never copy these files into
the repository.
"""

from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
SKIP_REASON = ("../shared/real-data/snapshots is absent (only CI and the project's machines have it; a clone has "
               "not)")


def shared_dir(needs: str = "real-data/snapshots") -> Path | None:
    """``../shared`` if it holds ``needs`` (a path inside it), else None."""
    candidates = [REPO_ROOT.parent / "shared"]
    dot_git = REPO_ROOT / ".git"
    if dot_git.is_file():
        gitdir = dot_git.read_text().partition("gitdir:")[2].strip()
        if gitdir:
            candidates.append(Path(gitdir).resolve().parents[2].parent / "shared")
    return next((c for c in candidates if (c / needs).exists()), None)


def real_data(name: str) -> Path | None:
    """``../shared/real-data/<name>`` when present."""
    shared = shared_dir(f"real-data/{name}")
    return shared / "real-data" / name if shared else None


def real_snapshots() -> list[Path]:
    """The ``_dump_snapshot`` pickles recorded on real GPUs, or [] without ``../shared``."""
    shared = shared_dir("real-data/snapshots")
    return sorted((shared / "real-data" / "snapshots").glob("*.pickle")) if shared else []
