"""A witness in every Python process of a loopback cluster: who reached for which address.

``tools.ray_cluster.LoopbackCluster`` copies this file, as ``sitecustomize.py``, into a directory
it puts first on the ``PYTHONPATH`` of every process it starts (Ray's dashboard, its agents, the
log monitor, every worker, and whatever those start), and names the directory records go to in
``POLYLOOP_NET_AUDIT_DIR``; the driver calls ``install`` itself. Python imports
``sitecustomize`` at start-up, which installs an audit hook (``sys.addaudithook``, PEP 578) on
the socket events that reach for an address:

* ``socket.connect``, ``socket.sendto``, ``socket.sendmsg`` (an ``AF_INET``/``AF_INET6``
  address), ``socket.getaddrinfo``, ``socket.gethostbyname``, ``socket.gethostbyaddr``,
  ``socket.getnameinfo`` (a name or an address to look up);

and appends one JSON line to ``<dir>/<pid>.jsonl`` for each that names anything but loopback:
an IP address outside ``127.0.0.0/8`` and ``::1`` (the unspecified address, the local
machine's wildcard, is allowed), or a host name other than ``localhost`` (looking a name up may
ask a DNS server elsewhere). Each process also leaves ``<dir>/armed-<pid>``, so a test can show
the hook ran everywhere. The hook only records; it never refuses an operation, so Ray behaves
exactly as without it. What stops the traffic is the loopback-only network namespace
(``tools.netns``): there, such a ``connect`` fails at once with ``ENETUNREACH``, nothing sent.
Processes that are not Python (Ray's ``gcs_server`` and ``raylet``) are covered by the
namespace alone.

Stdlib only: this runs before anything else in processes whose ``sys.path`` may hold nothing
of this repository.
"""

from __future__ import annotations

import contextlib
import importlib.machinery
import importlib.util
import ipaddress
import json
import os
import socket
import sys
import time
from collections.abc import Sequence
from types import FrameType
from typing import Any, Final

__all__ = ["ENVIRONMENT_VARIABLE", "disarm", "install", "judge"]

ENVIRONMENT_VARIABLE: Final = "POLYLOOP_NET_AUDIT_DIR"
_ADDRESS_EVENTS: Final = frozenset({"socket.connect", "socket.sendto", "socket.sendmsg"})
_NAME_EVENTS: Final = frozenset(
    {"socket.getaddrinfo", "socket.gethostbyname", "socket.gethostbyaddr", "socket.getnameinfo"}
)
_INET_FAMILIES: Final = (socket.AF_INET, socket.AF_INET6)
_state: dict[str, Any] = {"directory": None, "installed": False}


def _host_is_loopback(host: object) -> bool:
    """True for a host that stays on this machine: loopback, the wildcard, ``localhost``."""
    if host is None:
        return True  # getaddrinfo(None, port): a local (passive) address, no lookup
    if isinstance(host, bytes):
        host = host.decode("ascii", errors="replace")
    if not isinstance(host, str):
        return False
    name = host.strip().strip("[]").split("%", 1)[0]
    if name in {"", "localhost"} or name.endswith(".localhost"):
        return True
    try:
        address = ipaddress.ip_address(name)
    except ValueError:
        return False  # a name other than localhost: resolving it may ask a DNS server
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback or address.is_unspecified


def judge(event: str, args: Sequence[Any]) -> str | None:
    """What ``event`` (an audit event with ``args``) reaches for off loopback; ``None``: nothing."""
    if event in _ADDRESS_EVENTS:
        if len(args) < 2 or not isinstance(args[1], tuple) or len(args[1]) < 2:
            return None  # sendmsg without an address, an AF_UNIX path, ...
        family = getattr(args[0], "family", None)
        if family not in _INET_FAMILIES:
            return None
        host, port = args[1][0], args[1][1]
        return None if _host_is_loopback(host) else _shown(host, port)
    if event in _NAME_EVENTS and args:
        target = args[0]
        if event == "socket.getnameinfo" and isinstance(target, tuple) and target:
            target = target[0]
        if event == "socket.getaddrinfo" and len(args) > 1:
            return None if _host_is_loopback(target) else _shown(target, args[1])
        return None if _host_is_loopback(target) else _shown(target)
    return None


def _shown(host: object, port: object = None) -> str:
    name = host.decode("ascii", errors="replace") if isinstance(host, bytes) else str(host)
    if port is None:
        return name
    return f"[{name}]:{port}" if ":" in name else f"{name}:{port}"


def _command() -> str:
    try:
        with open("/proc/self/cmdline", "rb") as handle:
            raw = handle.read()
    except OSError:
        return " ".join(sys.argv)
    return raw.replace(b"\0", b" ").decode("utf-8", errors="replace").strip()[:200]


def _where() -> list[str]:
    """The innermost frames outside this file: who made the call."""
    frames: list[str] = []
    frame: FrameType | None = sys._getframe(2)
    while frame is not None and len(frames) < 12:
        code = frame.f_code
        if code.co_filename != __file__:
            frames.append(f"{code.co_filename}:{frame.f_lineno} {code.co_name}")
        frame = frame.f_back
    return frames


def _append(directory: str, record: dict[str, Any]) -> None:
    line = json.dumps(record, sort_keys=True) + "\n"
    descriptor = os.open(
        os.path.join(directory, f"{os.getpid()}.jsonl"), os.O_WRONLY | os.O_CREAT | os.O_APPEND
    )
    try:
        os.write(descriptor, line.encode("utf-8"))
    finally:
        os.close(descriptor)


def _hook(event: str, args: tuple[Any, ...]) -> None:
    if not event.startswith("socket."):
        return
    directory = _state["directory"]
    if directory is None:
        return
    try:
        target = judge(event, args)
        if target is None:
            return
        record = {
            "pid": os.getpid(),
            "command": _command(),
            "event": event,
            "target": target,
            "where": _where(),
            "time": time.time(),
        }
        _append(directory, record)
    except Exception as exc:  # noqa: BLE001 - a witness must never change what it watches; the failure is recorded
        with contextlib.suppress(OSError):
            _append(directory, {"pid": os.getpid(), "event": "hook-error", "target": repr(exc)})


def install(directory: str) -> None:
    """Record this process's attempts in ``directory`` (the hook is added once per process)."""
    _state["directory"] = directory
    if not _state["installed"]:
        sys.addaudithook(_hook)
        _state["installed"] = True
    with open(os.path.join(directory, f"armed-{os.getpid()}"), "w", encoding="utf-8") as handle:
        handle.write(_command())


def disarm() -> None:
    """Stop recording in this process (an audit hook cannot be removed; it goes quiet)."""
    _state["directory"] = None


def _run_the_next_sitecustomize() -> None:
    """Run the ``sitecustomize`` this file shadows, if the interpreter has one."""
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [entry for entry in sys.path if os.path.abspath(entry or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)


if __name__ == "sitecustomize":  # pragma: no cover - runs in the cluster's processes
    if os.environ.get(ENVIRONMENT_VARIABLE):
        install(os.environ[ENVIRONMENT_VARIABLE])
    _run_the_next_sitecustomize()
