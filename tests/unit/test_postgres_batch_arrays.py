"""The group commit's arrays, built by ``PostgresRunStore`` itself (design 0212, "fleet client
CPU"), are byte for byte what psycopg's own binary dumpers send for the same lists: a batch's
run ids, lines, epochs (NULL for an unfenced write) and start flags, one element per line (a
pair has two). The statement's result on a real server is tested by the contract suite and
``tests/integration/test_postgres_group_commit.py``."""

from __future__ import annotations

import asyncio
import importlib.util

import pytest

from _infra import skip_unless_available
from polyloop.stores._group_commit import Pending


@pytest.fixture(autouse=True)
def _needs_psycopg() -> None:
    skip_unless_available(
        importlib.util.find_spec("psycopg") is not None,
        what="psycopg (the postgres extra)",
        how_to_install="pip install -e '.[postgres]' (make install)",
    )


def _psycopg_dump(values: list[object]) -> bytes:
    from psycopg.adapt import PyFormat, Transformer

    dumper = Transformer().get_dumper(values, PyFormat.BINARY)
    return bytes(dumper.dump(values))


async def test_the_batch_arrays_are_psycopgs_binary_arrays_of_the_same_lists() -> None:
    from psycopg.types.numeric import Int8

    from polyloop.stores._postgres import _batch_arrays

    future = asyncio.get_running_loop().create_future()
    batch = [
        Pending("run-a", (b'{"record": "run_started"}\n',), None, True, future),
        Pending("rün-ß", (b'{"record": "a"}\n', b'{"record": "b"}\n'), 7, False, future),
        Pending("run-c", (b"",), 2**40, False, future),
        Pending("run-d", (b'{"x": "\\u0000"}\n',), None, False, future),
    ]
    arrays = _batch_arrays(batch, "utf-8")
    per_line = [(p, line) for p in batch for line in p.lines]
    assert arrays["p1"].data == _psycopg_dump([p.run_id for p, _ in per_line])
    assert arrays["p2"].data == _psycopg_dump([line for _, line in per_line])
    epochs = [None if p.epoch is None else Int8(p.epoch) for p, _ in per_line]
    assert arrays["p3"].data == _psycopg_dump(epochs)
    assert arrays["p4"].data == _psycopg_dump([p.start for p, _ in per_line])


async def test_fenced_epochs_only_carry_no_null_flag() -> None:
    from psycopg.types.numeric import Int8

    from polyloop.stores._postgres import _batch_arrays

    future = asyncio.get_running_loop().create_future()
    batch = [Pending(f"r{i}", (b"x\n",), i + 1, False, future) for i in range(3)]
    assert _batch_arrays(batch, "utf-8")["p3"].data == _psycopg_dump(
        [Int8(i + 1) for i in range(3)]
    )
