"""``python -m polyloop``: the run inspector (``show``, ``ls``, ``diff``, ``html``, and the
commands that write: ``resolve``, ``approve``, ``reject``, ``fork``; ``replay`` reads), and
``batch``.

Everything lives in ``polyloop.inspect`` (``batch`` in ``polyloop.batch``); this module only
hands them the command line, and
handles a reader that goes away: ``python -m polyloop show RUN.jsonl | head`` closes the pipe
early, and the command then stops quietly with status 141 (128 + SIGPIPE, what a shell reports
for a program killed by a broken pipe), with no traceback. Standard output is pointed at
``os.devnull`` first, so that the interpreter's own flush at exit cannot fail again.
"""

from __future__ import annotations

import importlib
import os
import sys

from polyloop.inspect import main

BATCH_COMMAND = "polyloop.batch._cli"
"""``python -m polyloop batch ...`` is this module's ``main``, loaded by name when asked for: the
inspector's own import graph stays free of what a batch may reach (Ray with ``--ray``, the
HTTP client of an agent's model string), as contracts r11 and r12 require of it."""

EXIT_BROKEN_PIPE = 141
"""The status of a command whose reader closed its standard output (128 + SIGPIPE)."""


def run() -> int:
    """``main()``, its output flushed; ``EXIT_BROKEN_PIPE`` when the reader has gone."""
    try:
        if sys.argv[1:2] == ["batch"]:
            status = int(importlib.import_module(BATCH_COMMAND).main(sys.argv[2:]))
        else:
            status = main()
        sys.stdout.flush()
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    return status


if __name__ == "__main__":
    sys.exit(run())
