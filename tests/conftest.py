"""Settings every test process needs before any test module is imported.

``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``: Ray reads it when it is first imported (which the
package-walking tests do, through ``polyloop.ray``). Set, Ray uses the loopback address for
this machine instead of its interface address; the project's machines allow loopback only.
See ``tools/ray_cluster.py``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"

# The repository root, so that tests can import the tools (tools.ray_cluster, tools.soak, ...).
_ROOT = str(Path(__file__).resolve().parents[1])
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)
