"""Developer tools that live next to the library and are never shipped in its wheel.

``python -m tools.demo`` is the offline demo (the project's main job); ``tools.soak`` and
``tools.bench`` hold the soak harness and the benchmarks; ``tools/release_check.sh`` is
``make release-check``. This file exists so that ``python -m tools.<name>`` works from the
repository root; nothing here is part of polyloop's public API.
"""
