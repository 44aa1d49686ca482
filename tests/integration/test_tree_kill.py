"""The tree kill storm at a CI size (issue 38, design 0245): three-level trees of runs
SIGKILLed at random moments and restarted until they end (``tools.soak.tree_kills``, whose
docstring lists the verdict): 0 ``NEVER`` effects twice, 0 model calls by a run after it
finished, every tree at its end with its links whole, every trajectory equal to the
uninterrupted tree's. The 1,000-kill figure and its command are in
``research-wiki/reference/reliability.md``."""

from __future__ import annotations

from pathlib import Path

import pytest
from tools.soak.tree_kills import storm

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_trees_killed_at_random_moments_end_as_the_uninterrupted_tree(tmp_path: Path) -> None:
    figures = storm(tmp_path, trees=2, kills_per_tree=3, seed=38, min_kills=4)
    assert figures.violations == []
    assert figures.trees >= 2
    assert figures.kills >= 4, figures.lines()  # or it proved nothing
    print("\n".join(figures.lines()))
