"""``ForwardingRunStore``: the base for a store wrapper that keeps the wrapped store's leases.

A wrapper that forwards the seven ``RunStore`` methods but not ``acquire_lease`` turns the
wrapped store's leases off without a word: ``run()``/``resume()`` see a plain ``RunStore``,
take no lease, and two resumers of one run id can both execute its next ``NEVER`` action
(issue 20: a test's own wrapper did exactly that). Subclass ``ForwardingRunStore`` instead and
override only what the wrapper changes:

=================================  ============================================================
member of ``ForwardingRunStore``   behaviour
=================================  ============================================================
``ForwardingRunStore(inner)``      wraps ``inner``, which must be a ``RunStore``
                                   (``PolyloopTypeError`` otherwise)
``inner``                          the wrapped store
the five write methods,            forwarded to ``inner`` unchanged
``read_log``, ``parameters``
``acquire_lease``                  present exactly when ``inner`` has one, and forwarded to it
                                   (the lease is ``inner``'s own, fenced by ``inner``): so
                                   ``isinstance(wrapper, LeasingRunStore)`` answers as it does
                                   for ``inner``. A subclass that defines ``acquire_lease``
                                   itself keeps its own
``offers_leases``                  ``False`` when ``inner`` says ``offers_leases = False`` (a
                                   store that truly has no leases); absent otherwise
``write_settlement``,              present exactly when ``inner`` has them (the
``write_approval_request``         ``SettlingRunStore`` capability, designs 0206 and 0210), and
                                   forwarded to it: ``isinstance(wrapper, SettlingRunStore)``
                                   answers as it does for ``inner``. A subclass that defines
                                   ``write_settlement`` itself keeps its own (and defines
                                   ``write_approval_request`` too)
``write_record``                   (``RecordWrites``, design 0220: a record kind that has no
                                   typed method) present when ``inner`` has it and the
                                   subclass overrides no write method; a wrapper that observes
                                   or changes writes defines it itself, or a kind without a
                                   typed method is refused rather than written past it
=================================  ============================================================

Writes made through a lease go to the lease, not through the wrapper's write methods. A
wrapper that observes or changes writes (fault injection, counting, delays) must see the
leased ones too, or it sees nothing of a run on a leasing store. So a subclass that overrides
a write method of a leasing ``inner`` without overriding ``acquire_lease`` is refused at
construction (``PolyloopTypeError``): it overrides ``acquire_lease`` as well and returns a
``polyloop.ports.RunLease`` of its own around the inner store's lease (``run_id``,
``epoch``, the five writes, ``write_settlement`` and ``write_approval_request`` when the inner
lease has them, ``release``), certified with ``polyloop.testing.RunLeaseContract``; or it says
``offers_leases = False`` and runs unleased, seeing every write.

``polyloop.testing.RunStoreContract`` fails a store that offers no ``acquire_lease`` unless
it (or the contract subclass) says ``offers_leases = False``.
"""

from __future__ import annotations

from collections.abc import Mapping

from polyloop.errors import PolyloopTypeError
from polyloop.ports import OPTIONAL_WRITES, LeasingRunStore, RunLog, RunStore, SettlingRunStore
from polyloop.types import RECORDS, Intent, ModelCallResult, RunFinished, RunStarted, StepCompleted

__all__ = ["ForwardingRunStore"]


class ForwardingRunStore:
    """A ``RunStore`` that forwards everything to ``inner``, leases included (module docs)."""

    def __init__(self, inner: RunStore) -> None:
        if not isinstance(inner, RunStore):
            raise PolyloopTypeError(
                f"{type(self).__name__}: inner must be a RunStore (the five write methods, "
                f"read_log and parameters), got {type(inner).__name__}; pass the store this "
                "wrapper stands in front of"
            )
        self._inner = inner
        # As for acquire_lease below: there exactly when the inner store has them.
        if not hasattr(type(self), "write_settlement") and isinstance(inner, SettlingRunStore):
            self.write_settlement = inner.write_settlement
            self.write_approval_request = inner.write_approval_request
        if not _overridden_writes(type(self)) and callable(getattr(inner, "write_record", None)):
            self.write_record = inner.write_record  # type: ignore[attr-defined]
        if hasattr(type(self), "acquire_lease"):
            return  # the subclass leases its own way
        if getattr(type(self), "offers_leases", None) is False:
            return  # the subclass runs unleased on purpose (and sees every write)
        if isinstance(inner, LeasingRunStore):
            overridden = _overridden_writes(type(self))
            if overridden:
                raise PolyloopTypeError(
                    f"{type(self).__name__} overrides {', '.join(overridden)} but not "
                    f"acquire_lease, and {type(inner).__name__} leases: a run writes through "
                    "the lease, so those overrides would never see a write. Override "
                    "acquire_lease too (return a RunLease of your own around the inner "
                    "lease), or set offers_leases = False on the class and run unleased"
                )
            # The inner store's own method, as an instance attribute: the capability is there
            # exactly when the inner store has it (``isinstance(self, LeasingRunStore)``
            # looks for the attribute), and a lease is the inner store's lease.
            self.acquire_lease = inner.acquire_lease
        elif getattr(inner, "offers_leases", None) is False:
            self.offers_leases = False

    @property
    def inner(self) -> RunStore:
        """The wrapped store."""
        return self._inner

    async def write_run_started(self, record: RunStarted) -> None:
        """``inner.write_run_started(record)``."""
        await self._inner.write_run_started(record)

    async def write_intent(self, record: Intent) -> None:
        """``inner.write_intent(record)``."""
        await self._inner.write_intent(record)

    async def write_model_call_result(self, record: ModelCallResult) -> None:
        """``inner.write_model_call_result(record)``."""
        await self._inner.write_model_call_result(record)

    async def write_step_completed(self, record: StepCompleted) -> None:
        """``inner.write_step_completed(record)``."""
        await self._inner.write_step_completed(record)

    async def write_run_finished(self, record: RunFinished) -> None:
        """``inner.write_run_finished(record)``."""
        await self._inner.write_run_finished(record)

    async def read_log(self, run_id: str) -> RunLog:
        """``inner.read_log(run_id)``."""
        return await self._inner.read_log(run_id)

    def parameters(self) -> Mapping[str, str]:
        """``inner.parameters()``: a wrapper that changes what is stored overrides it."""
        return self._inner.parameters()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._inner!r})"


_WRITES = (
    *(kind.write_method for kind in RECORDS.kinds if kind.write_method is not None),
    *OPTIONAL_WRITES,
)


def _overridden_writes(cls: type) -> list[str]:
    """The write methods a subclass ``cls`` defines instead of inheriting them."""
    return [
        name
        for name in _WRITES
        if getattr(cls, name, None) is not getattr(ForwardingRunStore, name, None)
    ]
