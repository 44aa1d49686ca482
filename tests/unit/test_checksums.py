"""Per-line checksums (issue 15, design point 7; design 0162): a changed byte is refused."""

from __future__ import annotations

import json
import re
import zlib
from pathlib import Path

import pytest
from _session_doubles import ScriptedModel, Tally, definition, tool_request

from polyloop.errors import DecodeError, LogCorruptError
from polyloop.session import resume, run
from polyloop.stores import JsonlRunStore, VolatileRunStore
from polyloop.types import ActionStatus

pytestmark = pytest.mark.unit

RUN = "run-1"


async def _logged_run(tmp_path: Path) -> bytes:
    tally = Tally()
    agent = definition(
        ScriptedModel(['tool:echo {"text": "hello"}', "final:done"]),
        store=JsonlRunStore(directory=tmp_path),
    )
    await run(agent, tool_request(tally))
    return (tmp_path / f"{RUN}.jsonl").read_bytes()


async def test_every_line_ends_with_the_crc32_of_the_line_without_it(tmp_path: Path) -> None:
    raw = await _logged_run(tmp_path)
    for line in raw.split(b"\n")[:-1]:
        payload = json.loads(line)
        assert list(payload)[-1] == "checksum"
        body, _, tail = line.rpartition(b', "checksum": "')
        assert tail == b'%08x"}' % zlib.crc32(body + b"}")


async def test_a_changed_character_in_an_observation_is_refused_naming_the_line(
    tmp_path: Path,
) -> None:
    raw = await _logged_run(tmp_path)
    assert raw.count(b"echo hello") >= 2
    lines = raw.split(b"\n")
    number = next(i for i, line in enumerate(lines, 1) if b'"step_completed"' in line)
    lines[number - 1] = lines[number - 1].replace(b"echo hello", b"echo hellO", 1)
    (tmp_path / f"{RUN}.jsonl").write_bytes(b"\n".join(lines))
    store = JsonlRunStore(directory=tmp_path)
    with pytest.raises(LogCorruptError, match=rf"line {number}: the checksum does not match"):
        await store.read_log(RUN)
    agent = definition(ScriptedModel([]), store=store)
    with pytest.raises(LogCorruptError) as caught:
        await resume(agent, tool_request(Tally()))
    assert caught.value.line == number


async def test_an_edited_line_that_claims_an_older_version_is_refused_naming_the_line(
    tmp_path: Path,
) -> None:
    """Issue 21: an edited observation whose line claims schema 1.2 (written before checksums)
    and drops its checksum passed as an old line; no line may claim an older version than its
    log's first record, so it is refused, by the store and by resume."""
    raw = await _logged_run(tmp_path)
    lines = raw.split(b"\n")
    number = next(i for i, line in enumerate(lines, 1) if b'"step_completed"' in line)
    body, _, _ = lines[number - 1].rpartition(b', "checksum": "')
    edited = body.replace(b"echo hello", b"echo hellO", 1)
    edited = re.sub(rb'"schema_version": "[0-9.]+"', b'"schema_version": "1.2"', edited, count=1)
    assert edited != body
    lines[number - 1] = edited + b"}"
    (tmp_path / f"{RUN}.jsonl").write_bytes(b"\n".join(lines))
    store = JsonlRunStore(directory=tmp_path)
    with pytest.raises(LogCorruptError, match=rf"line {number}: the line claims schema version"):
        await store.read_log(RUN)
    agent = definition(ScriptedModel([]), store=store)
    with pytest.raises(LogCorruptError) as caught:
        await resume(agent, tool_request(Tally()))
    assert caught.value.line == number


async def test_a_removed_or_moved_checksum_is_refused(tmp_path: Path) -> None:
    raw = await _logged_run(tmp_path)
    first, rest = raw.split(b"\n", 1)
    body, _, _ = first.rpartition(b', "checksum": "')
    for edited in (body + b"}", body.replace(b"{", b'{"checksum": "00000000", ', 1) + b"}"):
        (tmp_path / f"{RUN}.jsonl").write_bytes(edited + b"\n" + rest)
        with pytest.raises(LogCorruptError, match="line 1: the line's checksum is missing"):
            await JsonlRunStore(directory=tmp_path).read_log(RUN)


async def test_every_single_byte_flip_is_a_typed_error_or_invisible(tmp_path: Path) -> None:
    """Flip each byte of one line: the read raises the library's typed errors, or (when the
    flip hits the newline, which splits or merges lines) fails to decode; never another
    exception, and never a silently different record."""
    raw = await _logged_run(tmp_path)
    clean = await JsonlRunStore(directory=tmp_path).read_log(RUN)
    start = raw.index(b"\n") + 1
    end = raw.index(b"\n", start)
    accepted = 0
    for position in range(start, end):
        flipped = bytearray(raw)
        flipped[position] ^= 0x01
        (tmp_path / f"{RUN}.jsonl").write_bytes(bytes(flipped))
        try:
            log = await JsonlRunStore(directory=tmp_path).read_log(RUN)
        except (LogCorruptError, DecodeError):
            continue
        accepted += 1
        assert log == clean, f"byte {position} changed a record silently"
    assert accepted == 0


async def test_the_volatile_store_keeps_the_same_checksummed_bytes() -> None:
    store = VolatileRunStore()
    agent = definition(ScriptedModel(["tool:echo {}", "final:x"]), store=store)
    result = await run(agent, tool_request(Tally()))
    assert result.steps[0].action_status is ActionStatus.EXECUTED
    log = await store.read_log(RUN)
    assert log.finished is not None
    assert log.finished.result == result
