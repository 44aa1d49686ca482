"""The run's lease around a ``run``/``resume`` call (design 0120).

=================================  ============================================================
store                              what the call does
=================================  ============================================================
a ``LeasingRunStore``              takes the run's lease before anything reads its log (waiting
                                   up to ``lease_wait_seconds``, else ``RunLeaseHeldError``),
                                   writes every record through the lease, releases it when the
                                   call returns or raises (shielded: a second cancellation
                                   cannot stop the release)
a plain ``RunStore``               runs unleased: one resumer per run id is the caller's duty.
                                   This is said, not silent: an ``UnleasedStoreWarning`` the
                                   first time a given store object runs unleased in a process,
                                   unless the store says ``offers_leases = False``
                                   (a wrapper that forwards the ``RunStore`` methods but not
                                   ``acquire_lease`` turns leases off; ``ForwardingRunStore``
                                   in ``polyloop.stores`` forwards both)
=================================  ============================================================
"""

from __future__ import annotations

import asyncio
import contextlib
import warnings
import weakref

from polyloop._common import check_seconds
from polyloop.errors import UnleasedStoreWarning
from polyloop.ports import LeasingRunStore, RunLease, RunStore

__all__ = ["checked_lease_wait", "held_lease"]


class _UnleasedStores:
    """Stores already warned about, held weakly (a store that cannot be weakly referenced
    is warned about on every run)."""

    def __init__(self) -> None:
        self._seen: weakref.WeakSet[object] = weakref.WeakSet()

    def seen(self, store: object) -> bool:
        try:
            return store in self._seen
        except TypeError:  # no __weakref__ slot: cannot remember it, so say it every time
            return False

    def remember(self, store: object) -> None:
        with contextlib.suppress(TypeError):  # no __weakref__ slot: said again next time
            self._seen.add(store)


_WARNED = _UnleasedStores()
"""The one piece of process state in the session: which stores were already warned about."""


def _warn_unleased(store: RunStore, run_id: str) -> None:
    if getattr(store, "offers_leases", None) is False or _WARNED.seen(store):
        return
    # Remembered only once the warning was issued: under ``-W error`` it raises, and the
    # next run on this store must meet it again instead of running unleased in silence.
    warnings.warn(
        UnleasedStoreWarning(
            f"run {run_id!r}: the store {type(store).__name__} offers no acquire_lease, so "
            "this run is unleased: two processes resuming one run id at once could both run a "
            "NEVER action. If the store wraps a leasing store, forward acquire_lease (subclass "
            "polyloop.stores.ForwardingRunStore); otherwise keep to one resumer per run id. "
            "Said once per store object."
        ),
        stacklevel=2,
    )
    _WARNED.remember(store)


def checked_lease_wait(value: object) -> float:
    """``lease_wait_seconds`` as a float: a finite number >= 0 (0 refuses a held run at once)."""
    return check_seconds(
        value, where="", field="lease_wait_seconds", zero_means="to refuse a held run at once"
    )


def held_lease(store: RunStore, run_id: str, wait_seconds: float) -> _HeldLease:
    """Hold ``run_id``'s lease for the ``async with`` block; it gives what every record is
    written through (the lease, or ``store`` when it has no leases)."""
    return _HeldLease(store, run_id, wait_seconds)


class _HeldLease:
    """``held_lease``'s context manager: one object a run keeps for its whole call (an
    ``asynccontextmanager`` kept four: its generator, the wrapper, the loop's weak
    reference to the generator, and the generator's frame; design 0214, fourth pass)."""

    __slots__ = ("_lease", "_run_id", "_store", "_wait_seconds")

    def __init__(self, store: RunStore, run_id: str, wait_seconds: float) -> None:
        self._store = store
        self._run_id = run_id
        self._wait_seconds = wait_seconds
        self._lease: RunLease | None = None

    async def __aenter__(self) -> RunStore | RunLease:
        store = self._store
        if not isinstance(store, LeasingRunStore):
            _warn_unleased(store, self._run_id)
            return store
        self._lease = await store.acquire_lease(self._run_id, wait_seconds=self._wait_seconds)
        return self._lease

    async def __aexit__(self, *exc_info: object) -> None:
        lease, self._lease = self._lease, None
        if lease is not None:
            # ``release`` never raises for infrastructure failures (the RunLease contract).
            await asyncio.shield(lease.release())
