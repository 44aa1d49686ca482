"""The shipped ``RunStore`` implementations, and the base for a wrapper around one.

``JsonlRunStore`` writes one append-only JSON Lines file per run and survives crashes;
``VolatileRunStore`` keeps the same records in memory for tests and throwaway runs. Both satisfy
``polyloop.ports.RunStore`` structurally, store records in the same line format (documented in
``research-wiki/reference/log-format.md``) and raise the same ``DecodeError`` texts.

Both are also ``polyloop.ports.LeasingRunStore``s: ``acquire_lease(run_id)`` returns a
``JsonlRunLease`` / ``VolatileRunLease`` through which ``run()`` and ``resume()`` write, so one
run has one writer at a time (design 0120). ``PostgresRunStore`` (the ``postgres`` extra) keeps
the same records in a shared database, with ``PostgresRunLease``; its ``list_runs`` pages
through the runs there (``RunPage`` of ``RunSummary``, design 0213) and ``read_log_bytes``
reads many runs' logs as their JSONL bytes in one statement. The three lease classes are
one class underneath (``FencedRunLease`` in ``_leases.py``), each fenced by its store. A store
that refuses a second start of a run id raises ``polyloop.errors.RunAlreadyStartedError`` (a
``FileExistsError``). Every failure of these stores and their leases (a disk or database that
fails, a full disk, a schema they cannot use, a lease held elsewhere or lost) is a
``polyloop.errors.StoreError`` (design 0221). All three stores and their leases are also
``polyloop.ports.SettlingRunStore``s: ``write_settlement`` records the verdict on an execution
that was in doubt, or a person's decision on a call that waited for approval, and
``write_approval_request`` the request itself (both durability barriers, fenced through the
lease like every other write); ``read_log`` returns them in ``RunLog.settlements`` and
``RunLog.approval_requests``.

``ForwardingRunStore(inner)`` is the base for a store *wrapper* (fault injection, counting,
logging): it forwards every ``RunStore`` method and, exactly when ``inner`` has one,
``acquire_lease``, so wrapping a leasing store does not turn its leases off (``_forwarding.py``
says when a wrapper must wrap the lease too).

``RECORD_KEY`` is the key of the type tag each stored line carries (``"record"``).
``decode_line`` decodes one stored line (a ``DecodeError`` names the run and line and carries
``line``); ``decode_lines`` decodes a whole JSONL log's bytes into ``polyloop.ports.LogEntry``
items (each record with its 1-based line) by the JSONL store's own reading rule, which also
refuses a line that claims an older schema version than the log's first record; and
``assemble_log`` turns records in write order (and their lines) into a ``RunLog``. They exist
for readers that must say where a record is (``python -m polyloop``, the soak scoreboard).

This package is not re-exported by ``import polyloop``; import it explicitly.
"""

from polyloop._common import claim_public_names as _claim_public_names
from polyloop.stores._forwarding import ForwardingRunStore
from polyloop.stores._jsonl import JsonlRunLease, JsonlRunStore
from polyloop.stores._postgres import PostgresRunLease, PostgresRunStore
from polyloop.stores._postgres_listing import RunPage, RunSummary
from polyloop.stores._records import RECORD_KEY, assemble_log, decode_line, decode_lines
from polyloop.stores._volatile import VolatileRunLease, VolatileRunStore

__all__ = [
    "RECORD_KEY",
    "ForwardingRunStore",
    "JsonlRunLease",
    "JsonlRunStore",
    "PostgresRunLease",
    "PostgresRunStore",
    "RunPage",
    "RunSummary",
    "VolatileRunLease",
    "VolatileRunStore",
    "assemble_log",
    "decode_line",
    "decode_lines",
]

# Documented, printed and pickled under this module's name, not the room that defines it
# (design 0221): the one place that sets ``__module__`` for the public names.
_claim_public_names(__name__, globals())
