"""The ``studio`` entry point: no arguments opens the desktop app, ``studio FILE.qstudio``
opens that project in it, ``studio demo FILE`` shows a project's demo full screen, anything
else is the CLI.

It sits above both front ends so that ``studio.cli`` and ``studio.ui`` never import each
other.
"""

from __future__ import annotations

import sys

from studio.cli.main import main as cli_main
from studio.ui.app import main as gui_main
from studio.ui.printing import print_pdf
from studio.worker.__main__ import main as worker_main


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--studio-worker"]:
        # a frozen desktop build starts its stage workers as itself with this flag
        # (studio.services.workers.worker_command); a source or wheel install runs
        # ``python -m studio.worker`` instead

        return worker_main()
    if not argv or (len(argv) == 1 and argv[0].endswith(".qstudio")):
        return gui_main(argv)
    if argv[0] == "demo":
        # the demo window's modules (Qt): imported when a demo opens, so a command line
        # starts without Qt
        from studio.ui.demo import main as demo_main

        return demo_main(argv[1:])

    # the command line prints PDFs with Qt, which it may not import: it is handed a printer
    return cli_main(argv, pdf_printer=_print_pdf)


def _print_pdf(html: str, charts: dict[str, str]) -> bytes:
    return print_pdf(html, charts)


if __name__ == "__main__":
    sys.exit(main())
