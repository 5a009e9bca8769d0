"""``kvlab app``: one notebook served as a Voila dashboard."""

from __future__ import annotations

import kvlab.cli.flags as flags
from kvlab.argtypes import device_name as _device_name
from kvlab.argtypes import ip_address as _ip_address
from kvlab.argtypes import nonnegative_int as _nonnegative_int
from kvlab.argtypes import port as _port


def add_parser(commands, command: str | None) -> None:
    """``kvlab app``'s options (its defaults and the device presets are loaded only when it is the command: kvlab.app
    loads the report's modules, about 50 ms of every other command)."""
    if command in (None, "app"):
        from kvlab.app import DEFAULT_CULL_IDLE_SECONDS, DEFAULT_MAX_KERNELS
    else:
        DEFAULT_CULL_IDLE_SECONDS = DEFAULT_MAX_KERNELS = None
    DEVICE_PRESETS = flags.registry("kvlab.device.spec", "DEVICE_PRESETS", command in (None, "app"))
    app = commands.add_parser(
        "app", help="serve one notebook as a Voila dashboard (127.0.0.1 unless --ip; code hidden, widgets live)",
        description="Serve a notebook with Voila for demos: only outputs and live widgets are shown.")
    app.add_argument("notebook", nargs="?", default="01", help="notebook number or name (default: %(default)s)")
    app.add_argument("--port", type=_port, default=8866, help="port, 1 to 65535 (default: %(default)s)")
    app.add_argument("--ip", type=_ip_address, default="127.0.0.1", metavar="ADDRESS",
                     help="address to listen on: 127.0.0.1 (default) is this machine only; 0.0.0.0 serves a room "
                          "(the token stays; plain HTTP: see the README's Workshop section for TLS)")
    app.add_argument("--device", type=_device_name(DEVICE_PRESETS, "cpu"), default=None,
                     help="KVLAB_DEVICE for the kernel: auto, cpu, cuda, cuda:N, sim:<preset>")
    app.add_argument("--no-browser", action="store_true", help="do not open a web browser")
    app.add_argument("--cull-idle-seconds", type=_nonnegative_int, default=DEFAULT_CULL_IDLE_SECONDS, metavar="N",
                     help="shut down a page's kernel once it has been idle N s with no page connected "
                          "(a closed tab, a sleeping laptop); 0 = never (default: %(default)s)")
    app.add_argument("--notebook-dir", default=None, help="where the notebooks are (default: kvlab's, see kvlab.paths)")
    app.add_argument("--no-token", action="store_true",
                     help="serve without the random token in the printed URL: every user of this machine can then "
                          "open the page and run code as you")
    app.add_argument("--max-kernels", type=_nonnegative_int, default=DEFAULT_MAX_KERNELS, metavar="N",
                     help="pages (kernels) open at once; one more gets HTTP 503; 0 = no cap (default: %(default)s)")
    app.add_argument("--show-tracebacks", action="store_true",
                     help="show a failing cell's traceback on the page (default: hidden from viewers)")
    app.add_argument("--solutions", action="store_true",
                     help="workshops: each exercise offers its solution on the page (KVLAB_SOLUTIONS=1 for the kernels)")
    app.add_argument("--workshop", type=_nonnegative_int, default=0, metavar="N",
                     help="workshops: keep N pre-heated kernels that have already run the notebook, so a page shows "
                          "its panel at once (Voila's preheat_kernel; the page then renders whole, not cell by cell); "
                          "they come on top of --max-kernels (default: 0, off)")


def run(args) -> int:
    from kvlab.app import serve

    extra = {"notebook_dir": args.notebook_dir} if args.notebook_dir else {}
    return serve(args.notebook, port=args.port, ip=args.ip, device=args.device, open_browser=not args.no_browser,
                 cull_idle_seconds=args.cull_idle_seconds, token=not args.no_token, max_kernels=args.max_kernels,
                 show_tracebacks=args.show_tracebacks, solutions=args.solutions, pool_size=args.workshop, **extra)  # AppError: main() reports it
