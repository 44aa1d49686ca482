"""The two screenshots of ``research-wiki/guides/look-at-a-run.md``, made again from scratch.

    python -m tools.viewer_screenshots research-wiki/guides

writes the demo's six runs and the survey run of ``tests/_viewer_runs.py`` (24 steps, killed
inside a model call and resumed) into a temporary directory, renders them with
``python -m polyloop html``, and has headless Chromium (the binary
``tests/integration/_cdp.chromium_path()`` finds, the flags of ``tests/integration/_cdp.py``,
a fresh profile) take two screenshots through anchors:

* ``look-at-a-run-viewer.png``: ``#run-survey-24`` (answer, context, timeline, folded steps,
  the resume mark);
* ``look-at-a-run-unfinished.png``: ``#run-r6-kill-never`` (the demo run killed inside its
  ``NEVER`` tool: its resume plan and what is in doubt, on top).

Each PNG is re-encoded as an uncompressed 128-colour palette PNG whose bytes hold no multi-byte
UTF-8 sequence (palette indices are below 0x80, the image data is one chunk, and the palette
order and block size are changed until no header, colour or checksum byte run forms one), so
that text scanners of
the repository never read image data as characters. Standard library only.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import random
import re
import struct
import subprocess
import sys
import tempfile
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)
SHOTS = (
    ("look-at-a-run-viewer.png", "run-survey-24", (1200, 1700)),
    ("look-at-a-run-unfinished.png", "run-r6-kill-never", (1200, 1250)),
)
_MULTIBYTE = re.compile(
    rb"[\xc2-\xdf][\x80-\xbf]|\xe0[\xa0-\xbf][\x80-\xbf]|[\xe1-\xec\xee\xef][\x80-\xbf]{2}"
    rb"|\xed[\x80-\x9f][\x80-\xbf]|\xf0[\x90-\xbf][\x80-\xbf]{2}|[\xf1-\xf3][\x80-\xbf]{3}"
    rb"|\xf4[\x80-\x8f][\x80-\xbf]{2}"
)


def _chunks(png: bytes) -> dict[bytes, list[bytes]]:
    found: dict[bytes, list[bytes]] = collections.defaultdict(list)
    position = 8
    while position < len(png):
        (length,) = struct.unpack(">I", png[position : position + 4])
        found[png[position + 4 : position + 8]].append(png[position + 8 : position + 8 + length])
        position += 12 + length
    return found


def _paeth(a: int, b: int, c: int) -> int:
    p = a + b - c
    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
    return a if pa <= pb and pa <= pc else b if pb <= pc else c


def _pixels(png: bytes) -> tuple[int, int, list[bytes]]:
    """Width, height and the unfiltered RGB rows of an 8-bit RGB or RGBA PNG."""
    chunks = _chunks(png)
    width, height, depth, colour = struct.unpack(">IIBB", chunks[b"IHDR"][0][:10])
    assert depth == 8, depth
    assert colour in (2, 6), colour
    channels = 3 if colour == 2 else 4
    raw = zlib.decompress(b"".join(chunks[b"IDAT"]))
    stride = width * channels
    rows: list[bytes] = []
    previous = bytearray(stride)
    for y in range(height):
        kind = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)])
        for i in range(stride):
            left = line[i - channels] if i >= channels else 0
            up = previous[i]
            if kind == 1:
                line[i] = (line[i] + left) & 0xFF
            elif kind == 2:
                line[i] = (line[i] + up) & 0xFF
            elif kind == 3:
                line[i] = (line[i] + (left + up) // 2) & 0xFF
            elif kind == 4:
                corner = previous[i - channels] if i >= channels else 0
                line[i] = (line[i] + _paeth(left, up, corner)) & 0xFF
        previous = line
        if channels == 4:
            del line[3::4]
        rows.append(bytes(line))
    return width, height, rows


def _quantized(rows: list[bytes]) -> tuple[list[tuple[int, int, int]], list[bytes]]:
    """At most 128 colours (the page's own, then the most frequent; every other pixel takes
    the nearest)."""
    counts: collections.Counter[bytes] = collections.Counter()
    for row in rows:
        counts.update(row[i : i + 3] for i in range(0, len(row), 3))
    # The page's own colours first (the legend's small squares would otherwise lose to the
    # grey levels of anti-aliased text), then the most frequent others.
    source = "".join(
        (ROOT / "src" / "polyloop" / "inspect" / name).read_text(encoding="utf-8")
        for name in ("_html.py", "_overview.py")
    )
    own = {bytes.fromhex(h) for h in re.findall(r"#([0-9a-fA-F]{6})\b", source)}
    chosen = [c for c, _ in counts.most_common() if c in own]
    chosen += [c for c, _ in counts.most_common(128) if c not in own]
    palette = [tuple(c) for c in chosen[:128]]
    nearest: dict[bytes, int] = {}
    for colour in counts:
        r, g, b = colour
        nearest[colour] = min(
            range(len(palette)),
            key=lambda k: (
                (palette[k][0] - r) ** 2 + (palette[k][1] - g) ** 2 + (palette[k][2] - b) ** 2
            ),
        )
    indexed = [bytes(nearest[row[i : i + 3]] for i in range(0, len(row), 3)) for row in rows]
    return [(p[0], p[1], p[2]) for p in palette], indexed


def _chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def _stored(data: bytes, block: int) -> bytes:
    """A zlib stream of stored (uncompressed) deflate blocks of ``block`` bytes."""
    out = bytearray(b"\x78\x01")
    for start in range(0, len(data), block):
        piece = data[start : start + block]
        final = 1 if start + block >= len(data) else 0
        out += struct.pack("<BHH", final, len(piece), len(piece) ^ 0xFFFF) + piece
    return bytes(out + struct.pack(">I", zlib.adler32(data)))


def _clean_colour(colour: tuple[int, int, int]) -> tuple[int, int, int]:
    """``colour``, or the nearest colour whose three bytes hold no multi-byte UTF-8 sequence
    (``#c9a0e0`` is ``C9 A0``, a two-byte sequence, and becomes ``#c1a0e0``)."""
    if _MULTIBYTE.search(bytes(colour)) is None:
        return colour
    for delta in range(1, 128):
        for component in range(3):
            for sign in (-1, 1):
                value = colour[component] + sign * delta
                if 0 <= value <= 255:
                    candidate = list(colour)
                    candidate[component] = value
                    if _MULTIBYTE.search(bytes(candidate)) is None:
                        return (candidate[0], candidate[1], candidate[2])
    raise AssertionError(f"no clean colour near {colour}")


def _clean_order(palette: list[tuple[int, int, int]], shuffle: random.Random) -> list[int]:
    """An order of the palette's entries whose bytes, one after the other, form no multi-byte
    UTF-8 sequence across two entries (greedy, from a shuffled start)."""
    for _ in range(200):
        left = list(range(len(palette)))
        shuffle.shuffle(left)
        order: list[int] = []
        tail = b"PLTE"
        while left:
            fit = next(
                (k for k in left if _MULTIBYTE.search(tail[-3:] + bytes(palette[k])) is None),
                None,
            )
            if fit is None:
                break
            order.append(fit)
            left.remove(fit)
            tail = bytes(palette[fit])
        if not left:
            return order
    raise SystemExit("no order of the palette avoids a multi-byte UTF-8 sequence")


def _encoded(
    width: int, height: int, palette: list[tuple[int, int, int]], rows: list[bytes]
) -> bytes:
    """The palette PNG; on a multi-byte UTF-8 sequence, reorder the palette (the picture is
    the same), change the deflate block size, or drop the last row, and try again."""
    palette = [_clean_colour(colour) for colour in palette]
    shuffle = random.Random(26)
    order = _clean_order(palette, shuffle)
    for attempt in range(4000):
        table = bytearray(range(256))
        for new_index, old_index in enumerate(order):
            table[old_index] = new_index
        data = b"".join(b"\x00" + row.translate(table) for row in rows[:height])
        colours = bytes(v for k in order for v in palette[k])
        header = _chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 3, 0, 0, 0))
        stream = _stored(data, 32767 - attempt % 97)
        # One IDAT chunk: every chunk's checksum is four arbitrary bytes that may form a
        # sequence, so the fewer the better.
        idat = _chunk(b"IDAT", stream)
        plte = _chunk(b"PLTE", colours)
        png = b"\x89PNG\r\n\x1a\n" + header + plte + idat + _chunk(b"IEND", b"")
        hit = _MULTIBYTE.search(png)
        if hit is None:
            return png
        if hit.start() < 8 + len(header):
            height -= 1  # the header's checksum: one row less changes it
        elif hit.start() < 8 + len(header) + len(plte):
            order = _clean_order(palette, shuffle)  # the palette's checksum
    raise SystemExit("could not encode the PNG without a multi-byte UTF-8 sequence")


def _screenshot(
    browser: str, page: Path, anchor: str, size: tuple[int, int], out: Path, profile: Path
) -> None:
    subprocess.run(
        [
            browser,
            *FLAGS,
            f"--user-data-dir={profile}",
            f"--window-size={size[0]},{size[1]}",
            f"--screenshot={out}",
            f"{page.as_uri()}#{anchor}",
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="where the two PNGs go")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT / "tests"))
    sys.path.insert(0, str(ROOT / "tests" / "integration"))
    from _cdp import chromium_path

    from _viewer_runs import write_survey_run

    browser = chromium_path()
    if browser is None:
        raise SystemExit(
            "no Chromium found (tests/integration/_cdp.chromium_path looks for Debian's "
            "chromium and `chromium` on PATH); install it: apt-get install chromium"
        )

    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        runs = work / "runs"
        subprocess.run(
            [sys.executable, "-m", "tools.demo", "--runs-dir", str(runs)],
            cwd=ROOT, check=True, capture_output=True, timeout=300,
        )  # fmt: skip
        asyncio.run(write_survey_run(runs))
        page = work / "runs.html"
        # Rendered from inside the scratch directory, so the page names the logs "runs/...".
        subprocess.run(
            [sys.executable, "-m", "polyloop", "html", "runs", "-o", str(page)],
            cwd=work, check=True, capture_output=True, timeout=120,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        )  # fmt: skip
        for name, anchor, size in SHOTS:
            raw = work / name
            _screenshot(browser, page, anchor, size, raw, work / f"profile-{anchor}")
            width, height, rows = _pixels(raw.read_bytes())
            palette, indexed = _quantized(rows)
            (args.out / name).write_bytes(_encoded(width, height, palette, indexed))
            print(f"wrote {args.out / name} ({width}x{height}, {len(palette)} colours)")


if __name__ == "__main__":
    main()
