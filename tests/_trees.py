"""The three-level trees of ``tools/soak/trees.py`` (the tree kill storm's), for the tree
tests: one definition of the trees, so the suite checks what the storm runs."""

from tools.soak.trees import (
    CHILD_TOOL,
    LEVELS,
    Ledger,
    Tree,
    TreeModel,
    level_of,
    script_for,
    tree_definition,
)

__all__ = [
    "CHILD_TOOL",
    "LEVELS",
    "Ledger",
    "Tree",
    "TreeModel",
    "level_of",
    "script_for",
    "tree_definition",
]
