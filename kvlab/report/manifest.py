"""The report's output directory: its manifest (``DIR/.kvlab-report``, every file a report wrote with its SHA-256)
and the checks that keep a report from deleting or writing over anything it cannot prove it wrote (see
``kvlab.report``'s docstring for the rules)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import stat
import tempfile
from collections.abc import Sequence
from pathlib import Path

from kvlab.units import MiB

MARKER = ".kvlab-report"  # the manifest (JSON): {"kvlab_report_manifest": 1, "files": {relative path: sha256},
# "folders": [the report folders it made]}
MANIFEST_FORMAT = 1
_LEGACY_MARKER = "written by `kvlab report`; this directory may be overwritten by the next one\n"  # kvlab <= this
OUTPUT_FOLDERS = ("notebooks", "html", "figures")
MAX_MANIFEST_BYTES = 16 * MiB  # a report's manifest is a few kB
PLOTLY_JS_FILE = "html/plotly.min.js"  # plotly.js once for the whole report, beside the pages that load it


class ReportError(RuntimeError):
    """Bad arguments or an output directory kvlab must not touch."""


def _sha256(path: Path | str, dir_fd: int | None = None) -> str | None:
    """The SHA-256 of a regular file (not through a symlink, relative to ``dir_fd`` if given); ``None`` for
    anything else (a FIFO is opened without blocking, then refused)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dir_fd)
    except (OSError, ValueError):
        return None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        digest = hashlib.sha256()
        for chunk in iter(lambda: f.read(MiB), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _entry_problem(relative: object) -> str | None:
    """Why a manifest's file entry is not a path a report writes inside its folder (``None`` when it is one):
    a report writes ``NAME`` and ``FOLDER/NAME`` (FOLDER one of ``OUTPUT_FOLDERS``), nothing else."""
    if not isinstance(relative, str) or not relative or "\0" in relative:
        return "not a file name"
    parts = relative.split("/")
    if relative.startswith("/"):
        return "an absolute path"
    if ".." in parts:
        return "a path out of the folder"
    if "" in parts or "." in parts or len(parts) > 2 or (len(parts) == 2 and parts[0] not in OUTPUT_FOLDERS) \
            or relative == MARKER:
        return "a path no report writes"
    return None


class Manifest:
    """``DIR/.kvlab-report``: the files a report wrote in ``DIR`` (relative path → SHA-256) and the report folders
    it made, rewritten after each file is recorded, so an interrupted report still proves what it wrote."""

    def __init__(self, out_dir: Path, files: dict[str, str] | None = None, folders: Sequence[str] = ()) -> None:
        self.out_dir, self.files, self.folders = out_dir, dict(files or {}), list(folders)

    @property
    def path(self) -> Path:
        return self.out_dir / MARKER

    @classmethod
    def read(cls, out_dir: Path) -> Manifest | None:
        """The manifest of ``out_dir``; ``None`` when there is none. A marker of an older kvlab (which ``--force``
        could write into any folder) proves nothing: an empty manifest. Anything else there is refused, and so
        is a manifest naming a path a report never writes (outside ``out_dir``, through ``..``): nothing is
        deleted on its word."""
        path = out_dir / MARKER
        if not path.exists() and not path.is_symlink():
            return None
        text = _read_small(path)
        if text == _LEGACY_MARKER:
            return cls(out_dir)
        try:
            data = json.loads(text) if text is not None else None
        except (ValueError, RecursionError):
            data = None
        files = data.get("files") if isinstance(data, dict) and data.get("kvlab_report_manifest") == MANIFEST_FORMAT \
            else None
        folders = data.get("folders", []) if isinstance(data, dict) else None
        if not isinstance(files, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in files.items()) \
                or not isinstance(folders, list):
            raise ReportError(f"--out {out_dir}: {MARKER} there is not a kvlab report manifest; kvlab does not write "
                              f"over it: choose another directory")
        bad = [(entry, why) for entry in files if (why := _entry_problem(entry))]
        bad += [(entry, "not a report folder") for entry in folders if entry not in OUTPUT_FOLDERS]
        if bad:
            shown = ", ".join(f"{entry!r} ({why})" for entry, why in bad[:3]) + (
                f" and {len(bad) - 3} more" if len(bad) > 3 else "")
            raise ReportError(f"--out {out_dir}: {MARKER} lists {shown}: a kvlab report writes only inside its "
                              f"folder and never lists that; nothing was deleted. Remove {MARKER} if the folder "
                              f"is yours, or choose another directory")
        return cls(out_dir, files, folders)

    def _open_folder(self, relative: str) -> tuple[int, str]:
        """A descriptor of the folder holding ``relative`` (reached from ``out_dir`` without following a link)
        and the file's name in it; OSError when a folder on the way is a link or missing."""
        *folders, name = relative.split("/")
        fd = os.open(self.out_dir, os.O_RDONLY | os.O_DIRECTORY)
        try:
            for folder in folders:
                inner = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
                os.close(fd)
                fd = inner
        except BaseException:
            os.close(fd)
            raise
        return fd, name

    def owns(self, relative: str) -> bool:
        """Whether the file at ``relative`` is one this manifest proves a report wrote (unchanged since), reached
        inside ``out_dir`` without a link."""
        return self._owned(relative, remove=False)

    def remove_owned(self, relative: str) -> bool:
        """Delete the file at ``relative`` if :meth:`owns` it; whether it did."""
        return self._owned(relative, remove=True)

    def _owned(self, relative: str, *, remove: bool) -> bool:
        recorded = self.files.get(relative)
        if recorded is None or _entry_problem(relative):
            return False
        try:
            fd, name = self._open_folder(relative)
        except OSError:
            return False
        try:
            if _sha256(name, dir_fd=fd) != recorded:
                return False
            if remove:
                os.unlink(name, dir_fd=fd)
            return True
        except OSError:
            return False
        finally:
            os.close(fd)

    def remove_empty_folders(self) -> None:
        """Remove each report folder this manifest says a report made, if it is empty now (never a link); the ones
        left stay recorded."""
        kept = []
        for name in self.folders:
            try:
                os.rmdir(self.out_dir / name)  # a link is no directory to rmdir: ENOTDIR, left alone
            except FileNotFoundError:
                continue
            except OSError:
                kept.append(name)
        self.folders = kept

    def make_folders(self, names: Sequence[str]) -> None:
        """Create the report folders ``names`` that do not exist, recording them as the report's own."""
        for name in names:
            folder = self.out_dir / name
            if not folder.exists() and not folder.is_symlink():
                folder.mkdir()
                self.folders.append(name)
        self.save()

    def record(self, *paths: Path | None) -> None:
        for path in paths:
            if path is not None and Path(path).is_file():
                relative = Path(path).resolve().relative_to(self.out_dir).as_posix()
                self.files[relative] = _sha256(Path(path)) or ""
        self.save()

    def save(self) -> None:
        content: dict = {"kvlab_report_manifest": MANIFEST_FORMAT, "files": dict(sorted(self.files.items()))}
        if self.folders:
            content["folders"] = sorted(set(self.folders))
        data = json.dumps(content, indent=1) + "\n"
        fd, tmp = tempfile.mkstemp(dir=self.out_dir, prefix=f"{MARKER}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(data)
            os.chmod(tmp, 0o644)
            os.replace(tmp, self.path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise


def _read_small(path: Path) -> str | None:
    """The text of the regular file ``path`` (not through a link) if it is at most ``MAX_MANIFEST_BYTES``."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode) or os.fstat(fd).st_size > MAX_MANIFEST_BYTES:
            return None
        try:
            return f.read(MAX_MANIFEST_BYTES + 1).decode("utf-8")
        except (OSError, UnicodeDecodeError):
            return None


def _same_dir(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve() or (a.exists() and b.exists() and os.path.samefile(a, b))
    except OSError:
        return False


def prepare_out_dir(out: str | os.PathLike[str], *, force: bool = False, notebook_dir: str | os.PathLike[str] | None = None,
                    planned: Sequence[str] = ()) -> Path:
    """Create ``out``, or clear a previous report in it: the files its manifest proves a report wrote (unchanged
    since, reached without a link), and then the report folders it made if they are left empty; nothing else.
    Refuses any other existing non-empty directory unless ``force``; a path that is a file; a manifest naming a
    path no report writes; a report folder the ``planned`` files go into that is a link or not a folder; a
    ``notebook_dir`` that is ``out`` or one of its report folders; and any of the ``planned`` files (paths relative
    to ``out``) that exists and is not proven kvlab's: the report never writes over a file it did not write."""
    out, manifest = check_out_dir(out, force=force, notebook_dir=notebook_dir, planned=planned)
    if manifest is not None:  # ours: delete only what it proves it wrote
        for relative in list(manifest.files):
            manifest.remove_owned(relative)
        manifest.remove_empty_folders()
    taken = [p for p in planned if (out / p).exists() or (out / p).is_symlink()]
    if taken:
        shown = ", ".join(taken[:5]) + (f" and {len(taken) - 5} more" if len(taken) > 5 else "")
        raise ReportError(f"--out {out}: {shown} already there and not written by kvlab report (or changed since); "
                          f"kvlab never writes over a file it did not write: move it away or choose another "
                          f"directory")
    out.mkdir(parents=True, exist_ok=True)
    # what was proven is gone; a file someone changed is theirs now; a folder the report made and still holds
    # someone's file stays the report's (removed once empty)
    Manifest(out, folders=manifest.folders if manifest is not None else ()).save()
    return out


def check_out_dir(out: str | os.PathLike[str], *, force: bool = False,
                  notebook_dir: str | os.PathLike[str] | None = None,
                  planned: Sequence[str] = ()) -> tuple[Path, Manifest | None]:
    """``prepare_out_dir``'s refusals that need nothing deleted first, touching nothing: the resolved ``out`` and
    its manifest (``None`` when there is none)."""
    out = Path(out).resolve()
    if out.exists() and not out.is_dir():
        raise ReportError(f"--out {out}: exists and is not a directory")
    base = next(p for p in out.parents if p.exists()) if not out.exists() else out
    if not base.is_dir() or not os.access(base, os.W_OK | os.X_OK):
        raise ReportError(f"--out {out}: cannot be created ({base} is {'not a folder' if not base.is_dir() else 'not writable'})")
    if notebook_dir is not None:
        for target in (out, *(out / name for name in OUTPUT_FOLDERS)):
            if _same_dir(Path(notebook_dir), target):
                raise ReportError(f"--notebook-dir {notebook_dir}: the notebooks' own folder is where this report "
                                  f"would write ({target}); kvlab never writes into or clears the notebooks' "
                                  f"folder: choose another --out")
    manifest = Manifest.read(out) if out.is_dir() else None
    if out.is_dir() and any(out.iterdir()) and manifest is None and not force:
        raise ReportError(f"--out {out}: directory exists and is not a previous kvlab report "
                          f"(no {MARKER} file in it); choose another directory or pass --force "
                          f"(which writes beside the files there, never over one)")
    for name in sorted({p.split("/")[0] for p in planned if "/" in p}):
        folder = out / name
        if folder.is_symlink() or (folder.exists() and not folder.is_dir()):
            what = "a link" if folder.is_symlink() else "not a folder"
            raise ReportError(f"--out {out}: {name} there is {what}; kvlab report writes only inside its own "
                              f"folder, never through a link: move it away or choose another directory")
    return out, manifest


def planned_files(sources: Sequence[Path], *, pngs: bool) -> list[str]:
    """Every file a report of ``sources`` writes, relative to its directory (the manifest aside)."""
    files = ["index.html", "summary.json", PLOTLY_JS_FILE]
    for source in sources:
        files += [f"notebooks/{source.name}", f"html/{source.stem}.html"]
    if pngs:
        from kvlab.viz.export import FIGURE_CAPTIONS  # lazy: the core never imports plotly (only with figures)

        files += [f"figures/{stem}.png" for stem in FIGURE_CAPTIONS]
    return files
