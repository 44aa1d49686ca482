"""A batch item's identity: its key, and the run ids of its attempts (design 0242).

An item's first attempt runs under ``<batch id>--<key>``; attempt *n* (n >= 2), a retry that
continues attempt *n - 1*, under ``<batch id>--<key>--<n>``. Neither a batch id nor a key may
contain ``--``, so a run id names one batch, one item and one attempt, and the batch's runs are
exactly the run ids that start with ``<batch id>--``. Both use the characters every shipped
store accepts in a run id (``[A-Za-z0-9._-]``); neither starts or ends with ``-`` (nor starts
with ``.``), so no ``---`` can make one run id read as two batches' or two keys'.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from typing import Any, Final

from polyloop.errors import PolyloopTypeError, PolyloopValueError

__all__ = [
    "SEPARATOR",
    "attempt_run_id",
    "check_batch_id",
    "digest_key",
    "item_key",
    "parse_run_id",
]

SEPARATOR: Final = "--"
_NAME: Final = re.compile(r"[A-Za-z0-9._-]{1,100}")
_DIGEST_HEX: Final = 20


def _check_name(what: str, value: object) -> str:
    if not isinstance(value, str):
        raise PolyloopTypeError(f"{what} must be a str, got {type(value).__name__}")
    if (
        not _NAME.fullmatch(value)
        or SEPARATOR in value
        or value.startswith((".", "-"))
        or value.endswith("-")
    ):
        raise PolyloopValueError(
            f"{what} {value!r} must be 1 to 100 of the characters A-Z a-z 0-9 . _ -, not start "
            f"with '.' or '-', not end with '-', and not contain {SEPARATOR!r} (it separates "
            "batch id, key and attempt in a run id: batch 'b-' with key 'x' and batch 'b' with "
            "key '-x' would share the run 'b---x')"
        )
    return value


def check_batch_id(batch_id: object) -> str:
    """``batch_id`` if it is a valid batch id, else ``PolyloopTypeError``/``PolyloopValueError``."""
    return _check_name("batch_id", batch_id)


def digest_key(item: object) -> str:
    """The default key of an item: the first 20 hex digits of the SHA-256 of its canonical JSON
    (sorted keys, no spaces), so the same item has the same key in every process."""
    try:
        text = json.dumps(item, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    except (TypeError, ValueError) as exc:
        raise PolyloopTypeError(
            f"batch item {type(item).__name__} cannot be written as JSON for its default key "
            f"({exc}); pass key=<function of an item returning its key>"
        ) from exc
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:_DIGEST_HEX]


def item_key(key: Callable[[Any], object] | None, item: object) -> str:
    """The key of ``item``: ``key(item)`` checked, or ``digest_key(item)``."""
    if key is None:
        return digest_key(item)
    return _check_name("key(item)", key(item))


def attempt_run_id(batch_id: str, key: str, attempt: int) -> str:
    """The run id of attempt ``attempt`` (1 for the first) of the item ``key``."""
    base = f"{batch_id}{SEPARATOR}{key}"
    return base if attempt == 1 else f"{base}{SEPARATOR}{attempt}"


def parse_run_id(batch_id: str, run_id: str) -> tuple[str, int] | None:
    """``(key, attempt)`` of a run id of the batch ``batch_id``; ``None`` for any other."""
    prefix = f"{batch_id}{SEPARATOR}"
    if not run_id.startswith(prefix):
        return None
    rest = run_id[len(prefix) :].split(SEPARATOR)
    if len(rest) == 1 and rest[0]:
        return rest[0], 1
    if len(rest) == 2 and rest[0] and rest[1].isdigit() and int(rest[1]) >= 2:
        return rest[0], int(rest[1])
    return None
