"""A headless Chromium started and stopped by a test, driven over the DevTools protocol.

Standard library only: the protocol is JSON over one WebSocket on the loopback debugging port,
and the client below speaks just enough of RFC 6455 for it (masked text frames out, unmasked
frames in, no extensions). The browser is started with the flags the viewer test must use,
a fresh profile directory, and ``--remote-debugging-port=0`` (Chromium picks a free port on
127.0.0.1 and writes it to ``DevToolsActivePort`` in the profile). Every wait is bounded.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import socket
import struct
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

__all__ = ["CHROMIUM_FLAGS", "Browser", "DevToolsError", "chromium_path"]

CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)
"""The flags the issue prescribes: no connection anywhere but the page the test loads."""

START_TIMEOUT_SECONDS = 30.0
CALL_TIMEOUT_SECONDS = 20.0


class DevToolsError(AssertionError):
    """The browser did not start, answer, or behave within its bound."""


def chromium_path() -> str | None:
    """The Debian ``chromium`` binary, or ``None`` when it is not installed."""
    for candidate in ("/usr/bin/chromium", shutil.which("chromium") or ""):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


class _WebSocket:
    def __init__(self, port: int, path: str) -> None:
        self._sock = socket.create_connection(("127.0.0.1", port), timeout=CALL_TIMEOUT_SECONDS)
        key = base64.b64encode(os.urandom(16)).decode()
        request = (
            f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
        )
        self._sock.sendall(request.encode())
        response = b""
        while b"\r\n\r\n" not in response:
            chunk = self._sock.recv(4096)
            if not chunk:
                raise DevToolsError("the DevTools endpoint closed during the handshake")
            response += chunk
        head, _, self._buffer = response.partition(b"\r\n\r\n")
        if b" 101 " not in head.split(b"\r\n", 1)[0]:
            raise DevToolsError(f"WebSocket handshake refused: {head[:200]!r}")

    def send(self, text: str) -> None:
        payload = text.encode()
        header = bytearray([0x81])
        if len(payload) < 126:
            header.append(0x80 | len(payload))
        elif len(payload) < 1 << 16:
            header += bytes([0x80 | 126]) + struct.pack(">H", len(payload))
        else:
            header += bytes([0x80 | 127]) + struct.pack(">Q", len(payload))
        mask = os.urandom(4)
        header += mask
        self._sock.sendall(bytes(header) + bytes(b ^ mask[i % 4] for i, b in enumerate(payload)))

    def _read(self, size: int) -> bytes:
        while len(self._buffer) < size:
            chunk = self._sock.recv(65536)
            if not chunk:
                raise DevToolsError("the DevTools connection closed")
            self._buffer += chunk
        data, self._buffer = self._buffer[:size], self._buffer[size:]
        return data

    def receive(self) -> str:
        message = b""
        while True:
            first, second = self._read(2)
            length = second & 0x7F
            if length == 126:
                (length,) = struct.unpack(">H", self._read(2))
            elif length == 127:
                (length,) = struct.unpack(">Q", self._read(8))
            mask = self._read(4) if second & 0x80 else b""
            data = self._read(length)
            if mask:
                data = bytes(b ^ mask[i % 4] for i, b in enumerate(data))
            opcode = first & 0x0F
            if opcode == 0x8:
                raise DevToolsError("the browser closed the DevTools connection")
            if opcode in (0x9, 0xA):  # ping/pong: not used by DevTools, skip
                continue
            message += data
            if first & 0x80:
                return message.decode()

    def close(self) -> None:
        self._sock.close()


class Browser:
    """One headless Chromium with one page, for the length of a ``with`` block."""

    def __init__(self, binary: str, profile: Path) -> None:
        self._binary = binary
        self._profile = profile
        self._process: subprocess.Popen[bytes] | None = None
        self._socket: _WebSocket | None = None
        self._next_id = 0
        self.events: list[dict[str, Any]] = []

    def __enter__(self) -> Browser:
        self._profile.mkdir(parents=True, exist_ok=False)
        self._process = subprocess.Popen(
            [
                self._binary,
                *CHROMIUM_FLAGS,
                f"--user-data-dir={self._profile}",
                "--remote-debugging-port=0",
                "about:blank",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        port = self._wait_for_port()
        page = self._page_target(port)
        self._socket = _WebSocket(port, page)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._socket is not None:
            self._socket.close()
        if self._process is not None:
            self._process.terminate()
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait(timeout=10)

    def _wait_for_port(self) -> int:
        marker = self._profile / "DevToolsActivePort"
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        while time.monotonic() < deadline:
            assert self._process is not None
            if self._process.poll() is not None:
                raise DevToolsError(f"chromium exited with status {self._process.returncode}")
            if marker.is_file():
                lines = marker.read_text().split()
                if lines and lines[0].isdigit():
                    return int(lines[0])
            time.sleep(0.05)
        raise DevToolsError(
            f"chromium did not open its debugging port in {START_TIMEOUT_SECONDS} s"
        )

    @staticmethod
    def _page_target(port: int) -> str:
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        while time.monotonic() < deadline:
            with urllib.request.urlopen(
                f"http://127.0.0.1:{port}/json/list", timeout=CALL_TIMEOUT_SECONDS
            ) as response:
                targets = json.load(response)
            pages = [t for t in targets if t.get("type") == "page"]
            if pages:
                url = pages[0]["webSocketDebuggerUrl"]
                return "/" + url.split("/", 3)[3]
            time.sleep(0.05)
        raise DevToolsError("chromium has no page target")

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        """Send one command and return its result; events that arrive meanwhile are kept."""
        assert self._socket is not None
        self._next_id += 1
        ident = self._next_id
        self._socket.send(json.dumps({"id": ident, "method": method, "params": params}))
        deadline = time.monotonic() + CALL_TIMEOUT_SECONDS
        while time.monotonic() < deadline:
            message = json.loads(self._socket.receive())
            if message.get("id") == ident:
                if "error" in message:
                    raise DevToolsError(f"{method} failed: {message['error']}")
                result: dict[str, Any] = message.get("result", {})
                return result
            if "method" in message:
                self.events.append(message)
        raise DevToolsError(f"{method} got no answer within {CALL_TIMEOUT_SECONDS} s")

    def wait_for_event(self, method: str) -> dict[str, Any]:
        assert self._socket is not None
        for event in self.events:
            if event.get("method") == method:
                return event
        deadline = time.monotonic() + CALL_TIMEOUT_SECONDS
        while time.monotonic() < deadline:
            message = json.loads(self._socket.receive())
            if "method" in message:
                self.events.append(message)
                if message["method"] == method:
                    return message
        raise DevToolsError(f"no {method} within {CALL_TIMEOUT_SECONDS} s")

    def evaluate(self, expression: str) -> Any:
        """The JSON value of ``expression`` evaluated in the page."""
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in result:
            raise DevToolsError(f"the page raised: {result['exceptionDetails']}")
        return result["result"].get("value")

    def problems(self) -> list[str]:
        """Console errors, uncaught exceptions and error log entries seen so far."""
        found = []
        for event in self.events:
            method, params = event.get("method"), event.get("params", {})
            if method == "Runtime.exceptionThrown":
                found.append(f"exception: {params.get('exceptionDetails', {}).get('text')}")
            elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                found.append(f"console.{params.get('type')}: {params.get('args')}")
            elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
                found.append(f"log: {params['entry'].get('text')}")
        return found
