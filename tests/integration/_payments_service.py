"""A loopback "payments" service for the in-doubt kill test: ``python _payments_service.py DIR``.

It binds 127.0.0.1 on a free port, prints ``PORT <n>`` on stdout once it accepts connections,
and serves until it is terminated. Everything it does is appended, fsynced, to two files in
``DIR``, so the test can judge it whatever happened to the agents that called it:

* ``ledger.jsonl``: one line per movement of money, ``{"id", "kind", "key", "run_id", "call",
  "amount_cents"}``. This is what a double charge or a double transfer shows up in.
* ``requests.jsonl``: one line per ``POST`` received, ``{"kind", "key", "run_id", "call",
  "deduplicated"}``: how many times an execution reached the service, replays included.

Endpoints (JSON bodies ``{"run_id", "call", "amount_cents"}`` and an ``Idempotency-Key``
header on both ``POST``\\ s):

* ``POST /charge``: deduplicates by ``Idempotency-Key``. A repeated key returns the first
  response (``"replayed": true``) and moves no money: a tool behind it is ``IDEMPOTENT``.
* ``POST /transfer``: does **not** deduplicate. Every call moves money, which is what makes
  ``NEVER`` necessary. The key is recorded, so the service can say afterwards what happened.
* ``GET /transfers?key=K``: ``{"found": true, "transfer": {...}}`` when a transfer with key
  ``K`` happened, ``{"found": false}`` otherwise (what a reconciler asks).
* ``GET /ledger``: every ledger line, in order.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit


class Books:
    """The durable ledger and request log, one lock for both (a check-then-append is atomic)."""

    def __init__(self, directory: Path) -> None:
        self.lock = threading.Lock()
        self.ledger_path = directory / "ledger.jsonl"
        self.requests_path = directory / "requests.jsonl"
        self.entries: list[dict[str, Any]] = []
        self.charges_by_key: dict[str, dict[str, Any]] = {}
        self.transfers_by_key: dict[str, dict[str, Any]] = {}

    @staticmethod
    def _append(path: Path, record: dict[str, Any]) -> None:
        with path.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(record, sort_keys=True) + "\n")
            handle.flush()
            os.fsync(handle.fileno())

    def _move(self, kind: str, key: str, body: dict[str, Any]) -> dict[str, Any]:
        entry = {
            "id": f"{kind[:2]}-{len(self.entries) + 1}",
            "kind": kind,
            "key": key,
            "run_id": body.get("run_id"),
            "call": body.get("call"),
            "amount_cents": body.get("amount_cents"),
        }
        self._append(self.ledger_path, entry)
        self.entries.append(entry)
        return entry

    def _request(self, kind: str, key: str, body: dict[str, Any], deduplicated: bool) -> None:
        record = {
            "kind": kind,
            "key": key,
            "run_id": body.get("run_id"),
            "call": body.get("call"),
            "deduplicated": deduplicated,
        }
        self._append(self.requests_path, record)

    def charge(self, key: str, body: dict[str, Any]) -> dict[str, Any]:
        with self.lock:
            first = self.charges_by_key.get(key)
            self._request("charge", key, body, deduplicated=first is not None)
            if first is not None:
                return {**first, "replayed": True}
            entry = self._move("charge", key, body)
            self.charges_by_key[key] = entry
            return {**entry, "replayed": False}

    def transfer(self, key: str, body: dict[str, Any]) -> dict[str, Any]:
        with self.lock:
            self._request("transfer", key, body, deduplicated=False)
            entry = self._move("transfer", key, body)
            self.transfers_by_key.setdefault(key, entry)
            return {**entry, "replayed": False}

    def transfer_with(self, key: str) -> dict[str, Any] | None:
        with self.lock:
            return self.transfers_by_key.get(key)

    def ledger(self) -> list[dict[str, Any]]:
        with self.lock:
            return list(self.entries)


def handler_for(books: Books) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:
            pass  # quiet: the files are the record

        def _reply(self, status: int, payload: object) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_POST(self) -> None:
            path = urlsplit(self.path).path
            key = self.headers.get("Idempotency-Key")
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length)
            if len(raw) != length:
                return  # the caller died mid-request: nothing happened
            if not key:
                self._reply(400, {"error": "Idempotency-Key header required"})
                return
            try:
                body = json.loads(raw)
            except ValueError:
                self._reply(400, {"error": "body is not JSON"})
                return
            if path == "/charge":
                self._reply(200, books.charge(key, body))
            elif path == "/transfer":
                self._reply(200, books.transfer(key, body))
            else:
                self._reply(404, {"error": f"no {path}"})

        def do_GET(self) -> None:
            parts = urlsplit(self.path)
            if parts.path == "/transfers":
                key = parse_qs(parts.query).get("key", [""])[0]
                entry = books.transfer_with(key)
                found = {"found": True, "transfer": entry} if entry else {"found": False}
                self._reply(200, found)
            elif parts.path == "/ledger":
                self._reply(200, books.ledger())
            elif parts.path == "/health":
                self._reply(200, {"ok": True})
            else:
                self._reply(404, {"error": f"no {parts.path}"})

    return Handler


def main(directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler_for(Books(directory)))
    server.daemon_threads = True
    print(f"PORT {server.server_address[1]}", flush=True)
    server.serve_forever(poll_interval=0.1)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
