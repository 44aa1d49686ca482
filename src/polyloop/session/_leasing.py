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

Either way the call writes through one ``RunWriter`` (design 0220), built once over the lease
or the store: ``write(record)`` takes a record of any kind of ``polyloop.types.RECORDS`` to
the method its kind declares, and the optional capabilities are found once, by declaration
(``polyloop.ports.OPTIONAL_WRITES``, ``PairWrites``), never by looking for an attribute.
"""

from __future__ import annotations

import asyncio
import contextlib
import warnings
import weakref
from collections.abc import Awaitable, Callable

from polyloop._common import check_seconds
from polyloop.errors import PolyloopTypeError, UnleasedStoreWarning
from polyloop.ports import (
    OPTIONAL_WRITES,
    CheckedLease,
    LeasingRunStore,
    LogRecord,
    PairWrites,
    RunLease,
    RunStore,
)
from polyloop.types import RECORDS, RecordKind

__all__ = ["RunWriter", "checked_lease_wait", "held_lease"]

_Write = Callable[[LogRecord], Awaitable[None]]

_ROUTES: dict[tuple[type, frozenset[str]], dict[type, str | None]] = {}
"""Per target class and the optional write methods it declares: each kind's method name
(``None``: the target cannot take it), worked out once for all runs, so a ``RunWriter``
keeps no object of its own per kind (design 0214: what a waiting run keeps is counted)."""


def _route(kind: RecordKind, optional: frozenset[str]) -> str | None:
    """The name of the method that writes a ``kind`` record, or ``None``."""
    name = kind.write_method or "write_record"
    return name if kind.required or name in optional else None


class RunWriter:
    """What a run writes every record through: one object per ``run``/``resume`` call (or
    resolution), over the run's lease or its store (design 0220).

    ``write(record)`` hands ``record`` to the write method its kind declares in
    ``polyloop.types.RECORDS``: a ``RunStore``/``RunLease`` method, an optional one
    (``write_settlement``, ``write_approval_request``), or, for a kind with no typed method,
    ``RecordWrites.write_record``. Which method takes which kind is worked out once per
    target class; a write is one lookup by the record's class. A kind the target has no
    method for is refused (``PolyloopTypeError``) when written; ``can_write`` says so first.

    Capabilities are decided once, by declaration: the optional write methods by
    ``isinstance`` on their ``polyloop.ports.OPTIONAL_WRITES`` Protocol, ``pair``
    (``write_pair``) only where the target's class declares ``PairWrites`` (a wrapper
    forwarding unknown attributes is not paired past its own write methods). ``epoch`` is
    the lease's fencing token, handed in by ``held_lease`` (``None`` for a store).
    ``check_lease`` is the lease's ``check_current`` when it declares one
    (``polyloop.ports.CheckedLease``), else ``None``: what tools get as
    ``ToolContext.check_lease`` (design 0245).
    """

    __slots__ = ("_optional", "_routes", "check_lease", "epoch", "pair", "target")

    def __init__(self, target: RunStore | RunLease, *, epoch: object = None) -> None:
        self.target = target
        self.epoch = epoch
        self.check_lease: Callable[[], Awaitable[None]] | None = (
            target.check_current if isinstance(target, CheckedLease) else None
        )
        self.pair: Callable[[LogRecord, LogRecord], Awaitable[None]] | None = (
            target.write_pair  # type: ignore[union-attr]
            if issubclass(type(target), PairWrites)
            else None
        )
        self._optional = optional = frozenset(
            name for name, declared in OPTIONAL_WRITES.items() if _has(target, name, declared)
        )
        key = (type(target), optional)
        routes = _ROUTES.get(key)
        if routes is None:
            routes = {kind.record_cls: _route(kind, optional) for kind in RECORDS.kinds}
            _ROUTES[key] = routes
        self._routes = routes

    def can_write(self, record_cls: type) -> bool:
        """Whether the target has a method for records of ``record_cls``."""
        kind = RECORDS.by_class.get(record_cls)
        return kind is not None and _route(kind, self._optional) is not None

    def write(self, record: LogRecord) -> Awaitable[None]:
        """Write ``record`` through its kind's method (the awaitable that method returns)."""
        name = self._routes.get(type(record))
        if name is None:
            name = self._late_route(record)
        write: _Write = getattr(self.target, name)
        return write(record)

    def _late_route(self, record: LogRecord) -> str:
        """The method for a kind this writer has no route to: refused, or a kind added to the
        table after the routes were worked out (``RECORDS.scratch``)."""
        kind = RECORDS.by_class.get(type(record))
        if kind is None:
            raise PolyloopTypeError(
                f"a run writes only log records ({RECORDS.names()}), got "
                f"{type(record).__qualname__}"
            )
        name = _route(kind, self._optional)
        if name is None:
            method = kind.write_method or "write_record"
            raise PolyloopTypeError(
                f"the store {type(self.target).__name__} cannot record a "
                f"{kind.record_cls.__name__} (it has no {method}: the optional "
                f"polyloop.ports.{OPTIONAL_WRITES[method].__name__} capability); use a "
                "shipped store"
            )
        return name


def _has(target: object, name: str, declared: type) -> bool:
    """Whether ``target`` offers the optional write ``name`` (declared by the
    ``runtime_checkable`` Protocol ``declared``): by its class (the quick ``issubclass``), or
    else as a callable attribute of the instance (set in ``__init__``, or a wrapper's
    ``__getattr__``, which ``isinstance`` on a Protocol no longer sees from Python 3.12)."""
    return issubclass(type(target), declared) or callable(getattr(target, name, None))


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
    """Hold ``run_id``'s lease for the ``async with`` block; it gives the ``RunWriter`` every
    record is written through (over the lease, or over ``store`` when it has no leases)."""
    return _HeldLease(store, run_id, wait_seconds)


class _HeldLease:
    """``held_lease``'s context manager: one object a run keeps for its whole call (an
    ``asynccontextmanager`` kept four: its generator, the wrapper, the loop's weak
    reference to the generator, and the generator's frame; design 0214)."""

    __slots__ = ("_lease", "_run_id", "_store", "_wait_seconds")

    def __init__(self, store: RunStore, run_id: str, wait_seconds: float) -> None:
        self._store = store
        self._run_id = run_id
        self._wait_seconds = wait_seconds
        self._lease: RunLease | None = None

    async def __aenter__(self) -> RunWriter:
        store = self._store
        if not isinstance(store, LeasingRunStore):
            _warn_unleased(store, self._run_id)
            return RunWriter(store)
        lease = await store.acquire_lease(self._run_id, wait_seconds=self._wait_seconds)
        try:
            writer = RunWriter(lease, epoch=lease.epoch)
        except BaseException:
            # No ``__aexit__`` follows a failed ``__aenter__``: the lease is let go here.
            await asyncio.shield(lease.release())
            raise
        self._lease = lease
        return writer

    async def __aexit__(self, *exc_info: object) -> None:
        lease, self._lease = self._lease, None
        if lease is not None:
            # ``release`` never raises for infrastructure failures (the RunLease contract).
            await asyncio.shield(lease.release())
