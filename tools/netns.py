"""Is this process in a network namespace that has only loopback? (Ray runs only in one.)

Ray probes addresses outside the machine on every cluster start, whatever it is told (its
dashboard's usage-stats code asks the cloud metadata address ``169.254.169.254`` and
``metadata.google.internal``, and reports to ``usage-stats.ray.io``: issue 27). The project's
machines allow loopback only, so nothing here depends on Ray's good will: everything that starts
a Ray cluster (``tools.ray_cluster.LoopbackCluster``, hence the Ray tests, ``run_soak --engine
ray``, the Ray benchmarks and ``tools.ray_faults``) refuses to unless this process is in a
network namespace whose only interface is ``lo`` and that has no route beyond it. Make one with::

    unshare -n bash -c 'ip link set lo up && COMMAND'

(``unshare -n`` needs root, or a user namespace: ``unshare -rn``.) Inside, a ``connect`` to any
other address fails at once with ``ENETUNREACH``: nothing is sent. ``namespace_refusal`` says,
in one line, why this is not such a namespace and the command that runs this process in one.

``NetAudit`` is the witness beside that wall: the directory holding the generated
``sitecustomize.py`` (``tools/_net_audit_site.py``) that a cluster's processes get first on
their ``PYTHONPATH``, and the records its audit hook leaves of every reach for an address off
loopback. Linux only (``/proc``, ``/sys``); stdlib only, so it never imports Ray.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import socket
import sys
import sysconfig
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

__all__ = [
    "Attempt",
    "NetAudit",
    "NotInLoopbackNamespaceError",
    "command_in_namespace",
    "exit_unless_loopback_namespace",
    "in_loopback_namespace",
    "namespace_problems",
    "namespace_refusal",
    "require_loopback_namespace",
    "this_command",
    "try_connect",
]

_IFF_UP: Final = 0x1
_SITE_SOURCE: Final = Path(__file__).with_name("_net_audit_site.py")
_STDLIB: Final = sysconfig.get_paths()["stdlib"]
_PLUMBING: Final = tuple(
    f"/site-packages/{name}/" for name in ("urllib3", "requests", "httpx", "httpcore", "anyio")
)


class NotInLoopbackNamespaceError(RuntimeError):
    """Something that starts Ray was asked to run outside a loopback-only network namespace."""


def _interfaces() -> list[str]:
    try:
        return sorted(name for _, name in socket.if_nameindex())
    except OSError:  # no interface list at all (not Linux): nothing proves loopback only
        return ["(unknown: socket.if_nameindex() failed)"]


def _route_devices() -> list[str]:
    """The device of every IPv4 and IPv6 route this namespace has (``/proc/net/*route``)."""
    devices: list[str] = []
    ipv4 = Path("/proc/net/route")
    if ipv4.exists():
        for line in ipv4.read_text(encoding="ascii").splitlines()[1:]:
            if line.split():
                devices.append(line.split()[0])
    ipv6 = Path("/proc/net/ipv6_route")
    if ipv6.exists():
        for line in ipv6.read_text(encoding="ascii").splitlines():
            if line.split():
                devices.append(line.split()[-1])
    return devices


def _loopback_is_up() -> bool:
    try:
        flags = Path("/sys/class/net/lo/flags").read_text(encoding="ascii").strip()
    except OSError:
        return False
    return bool(int(flags, 16) & _IFF_UP)


def namespace_problems() -> list[str]:
    """Why this network namespace is not loopback-only (empty when it is, with ``lo`` up).

    Loopback-only means: the only interface is ``lo``, every IPv4 and IPv6 route goes through
    ``lo`` (a fresh ``unshare -n`` namespace has no IPv4 route in the main table at all; its
    IPv6 table holds only ``lo``'s own entries), and ``lo`` is up (Ray needs 127.0.0.1).
    """
    if not sys.platform.startswith("linux"):
        return [f"network namespaces are Linux only (this is {sys.platform})"]
    problems = []
    others = [name for name in _interfaces() if name != "lo"]
    if others:
        problems.append(f"interfaces besides lo: {', '.join(others)}")
    routed = sorted({device for device in _route_devices() if device != "lo"})
    if routed:
        problems.append(f"routes through {', '.join(routed)}")
    if not others and not _loopback_is_up():
        problems.append("lo is down (run 'ip link set lo up' inside the namespace)")
    return problems


def in_loopback_namespace() -> bool:
    """True when nothing but loopback is reachable from this process (see the module)."""
    return not namespace_problems()


def command_in_namespace(command: str) -> str:
    """``command`` (a shell command line) wrapped to run in a new loopback-only namespace."""
    return f"unshare -n bash -c {shlex.quote(f'ip link set lo up && {command}')}"


def this_command(argv: Sequence[str] | None = None) -> str:
    """This process's command line as typed (``sys.orig_argv``: ``python -m tools.x --y``)."""
    words = list(sys.orig_argv if argv is None else argv)
    if words and os.path.isabs(words[0]):
        executable = Path(words[0])
        try:
            words[0] = str(executable.relative_to(Path.cwd()))
        except ValueError:
            words[0] = str(executable)
    return shlex.join(words)


def namespace_refusal(what: str, command: str | None = None) -> str | None:
    """Why ``what`` must not start Ray here, and the command that runs it where it may, in one
    line; ``None`` in a loopback-only namespace.

    ``command`` is the command line to run inside a namespace instead (default: this process's
    own, ``this_command()``).
    """
    problems = namespace_problems()
    if not problems:
        return None
    shown = this_command() if command is None else command
    return (
        f"{what} starts Ray, which reaches for addresses outside this machine on every start "
        f"(issue 27), so it runs only in a loopback-only network namespace, and this one is not "
        f"({'; '.join(problems)}). Run it inside one: {command_in_namespace(shown)}"
    )


def require_loopback_namespace(what: str, command: str | None = None) -> None:
    """Raise ``NotInLoopbackNamespaceError`` (``namespace_refusal``'s words) unless this
    process is in a loopback-only network namespace."""
    refusal = namespace_refusal(what, command)
    if refusal is not None:
        raise NotInLoopbackNamespaceError(refusal)


def exit_unless_loopback_namespace(what: str) -> None:
    """For a tool's ``main``: exit with status 2 and ``namespace_refusal``'s line on stderr
    unless this process is in a loopback-only network namespace."""
    refusal = namespace_refusal(what)
    if refusal is not None:
        print(f"error: {refusal}", file=sys.stderr)
        raise SystemExit(2)


# --------------------------------------------------------------------------- the audit


@dataclass(frozen=True, slots=True)
class Attempt:
    """One recorded reach for an address off loopback (see ``tools/_net_audit_site.py``)."""

    pid: int
    command: str
    event: str
    target: str
    where: tuple[str, ...]

    def __str__(self) -> str:
        caller = f" from {self.caller()}" if self.where else ""
        return f"pid {self.pid} ({self.command[:60]}): {self.event} {self.target}{caller}"

    def caller(self) -> str:
        """The innermost recorded frame outside the standard library and HTTP client libraries:
        the code that wanted the address (falls back to the innermost frame)."""
        for frame in self.where:
            if not frame.startswith(_STDLIB) and not any(lib in frame for lib in _PLUMBING):
                return frame
        return self.where[0] if self.where else "?"


class NetAudit:
    """The audit hook for a set of processes: where its ``sitecustomize`` lives, what it saw.

    ``environment(python_path)`` is what the processes must inherit (``PYTHONPATH`` with the
    hook's directory first, and the records directory); ``arm()`` installs the hook in this
    process too. ``attempts()`` reads every process's records; ``forget()`` drops them (after a
    deliberate attempt, in the test of the check itself). ``close()`` removes the directory.
    """

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="polyloop-net-audit-"))
        self.site_dir = self.root / "site"
        self.records_dir = self.root / "records"
        self.site_dir.mkdir()
        self.records_dir.mkdir()
        shutil.copyfile(_SITE_SOURCE, self.site_dir / "sitecustomize.py")

    def environment(self, python_path: Sequence[str] = ()) -> dict[str, str]:
        from tools import _net_audit_site

        return {
            "PYTHONPATH": os.pathsep.join([str(self.site_dir), *python_path]),
            _net_audit_site.ENVIRONMENT_VARIABLE: str(self.records_dir),
        }

    def arm(self) -> None:
        from tools import _net_audit_site

        _net_audit_site.install(str(self.records_dir))

    def disarm(self) -> None:
        from tools import _net_audit_site

        _net_audit_site.disarm()

    def attempts(self) -> list[Attempt]:
        found = []
        for path in sorted(self.records_dir.glob("*.jsonl")):
            for line in path.read_text(encoding="utf-8").splitlines():
                if not line.strip():
                    continue
                record = json.loads(line)
                found.append(
                    Attempt(
                        pid=int(record.get("pid", 0)),
                        command=str(record.get("command", "")),
                        event=str(record["event"]),
                        target=str(record["target"]),
                        where=tuple(record.get("where", ())),
                    )
                )
        return found

    def armed_pids(self) -> set[int]:
        """Every process that installed the hook so far."""
        return {int(p.name.removeprefix("armed-")) for p in self.records_dir.glob("armed-*")}

    def forget(self) -> None:
        for path in self.records_dir.glob("*.jsonl"):
            path.unlink()

    def close(self) -> None:
        self.disarm()
        shutil.rmtree(self.root, ignore_errors=True)


def try_connect(host: str, port: int) -> tuple[int, int | None]:
    """``connect`` a TCP socket to ``(host, port)`` once: ``(this pid, errno or None)``.

    For the test of the audit itself (run in a cluster worker as a Ray task): inside a
    loopback-only namespace a non-loopback address fails at once with ``ENETUNREACH``.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.settimeout(2.0)
        try:
            probe.connect((host, port))
        except OSError as exc:
            return os.getpid(), exc.errno
    return os.getpid(), None
