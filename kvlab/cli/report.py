"""``kvlab report``: every notebook executed headless into an offline site."""

from __future__ import annotations

import sys

import kvlab.cli.flags as flags
from kvlab.argtypes import device_name as _device_name
from kvlab.argtypes import name_list as _name_list
from kvlab.errors import fail
from kvlab.safe_text import printable


def add_parser(commands, command: str | None) -> None:
    """``kvlab report``'s options (the device presets are loaded only when it is the command)."""
    DEVICE_PRESETS = flags.registry("kvlab.device.spec", "DEVICE_PRESETS", command in (None, "report"))
    report = commands.add_parser(
        "report", help="execute every notebook headless and write a static HTML report",
        description="Execute notebooks/*.ipynb headless and write DIR/index.html, the executed notebooks, "
                    "their HTML, PNGs of the key figures and summary.json (both findings, both arms).")
    report.add_argument("--out", default="kvlab-report", help="output directory (default: %(default)s)")
    report.add_argument("--device", type=_device_name(DEVICE_PRESETS), default="auto",
                        help="auto, cuda, cuda:N or sim:<preset> (default: %(default)s)")
    report.add_argument("--notebooks", type=_name_list, default=None, metavar="01,02,...",
                        help="comma-separated notebook numbers or names (default: all)")
    report.add_argument("--force", action="store_true",
                        help="write into an existing directory that is not a previous kvlab report (beside its "
                             "files: a file kvlab did not write is never written over or deleted)")
    report.add_argument("--no-png", action="store_true", help="skip the PNG export (no browser needed)")
    report.add_argument("--notebook-dir", default=None, help="where the notebooks are (default: kvlab's, see kvlab.paths)")


def run(args) -> int:
    from kvlab.report import ReportStopped, build_report

    only = args.notebooks  # a list of names (argtypes.name_list), or None for all
    extra = {"notebook_dir": args.notebook_dir} if args.notebook_dir else {}
    try:
        report = build_report(args.out, device=args.device, notebooks=only, force=args.force, pngs=not args.no_png,
                              **extra)  # ReportError, ValueError, OSError: main() reports them
    except ReportStopped as stop:  # SIGINT, SIGTERM, SIGHUP: what was written, and 128 + the signal
        print(f"kvlab: {printable(stop.message)}", file=sys.stderr)
        return stop.exit_status
    for run in report.runs:
        state = "ok" if run.ok else "FAILED"
        print(f"  {printable(run.name):<32} {state:>6}  {run.seconds:6.1f} s")
    print(f"wrote {printable(report.out_dir / 'index.html')} ({len(report.runs)} notebooks, {len(report.pngs)} "
          f"figures, {report.seconds:.0f} s)")
    for run in report.failures:
        fail(run.error)
    if report.figure_error:
        fail(report.figure_error)
    return 0 if report.ok else 1
