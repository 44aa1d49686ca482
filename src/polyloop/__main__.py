"""``python -m polyloop``: the run inspector (``show``, ``ls``, ``diff``, ``html``).

Everything lives in ``polyloop.inspect``; this module only hands it the command line.
"""

from __future__ import annotations

import sys

from polyloop.inspect import main

if __name__ == "__main__":
    sys.exit(main())
