"""The two shipped ``RunStore`` implementations.

``JsonlRunStore`` writes one append-only JSON Lines file per run and survives crashes;
``VolatileRunStore`` keeps the same records in memory for tests and throwaway runs. Both satisfy
``polyloop.ports.RunStore`` structurally, store records in the same line format (documented in
``research-wiki/reference/log-format.md``) and raise the same ``DecodeError`` texts.

``RECORD_KEY`` is the key of the type tag each stored line carries (``"record"``).

This package is not re-exported by ``import polyloop``; import it explicitly.
"""

from polyloop.stores._jsonl import JsonlRunStore
from polyloop.stores._records import RECORD_KEY
from polyloop.stores._volatile import VolatileRunStore

__all__ = ["RECORD_KEY", "JsonlRunStore", "VolatileRunStore"]
