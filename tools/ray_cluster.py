"""A throwaway Ray cluster on this machine, on loopback only (tests, soak, benchmarks).

``LoopbackCluster`` starts a head node (``num_cpus=0``: it places nothing) and worker nodes
with ``ray.cluster_utils.Cluster`` - several nodes on one machine, each a real raylet with its
own worker processes, which is what Ray's own multi-node tests use - and connects this process
to it as the driver. Every node gets ``node_ip_address="127.0.0.1"``, and
``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` is set before Ray is imported: without both, Ray
advertises the machine's interface address and cluster traffic leaves loopback, which the
project's machines forbid. ``sockets_off_loopback`` reads ``/proc`` to prove it.

Ray also reaches for addresses outside the machine on every start, whatever it is told (issue
27), so ``LoopbackCluster`` starts only inside a network namespace that has nothing but
loopback (``tools/netns.py``; it raises ``NotInLoopbackNamespaceError`` with the ``unshare -n``
command elsewhere), quiets Ray at the source (``QUIET_RAY``, and the head's own ``HOME``: see
``_head_home``), and watches: every Python process of the cluster, and this driver while the
cluster is up, runs an audit hook (``tools/_net_audit_site.py``) that records each attempt to
reach anything but loopback. ``off_loopback_attempts()`` lists them; leaving the ``with`` block
raises ``OffLoopbackError`` when there were any.

Health checks are fast (a dead node is noticed in about a second instead of about fifteen), as
in Ray's own tests. Leaving the ``with`` block shuts the cluster down and kills (by process id)
any of its processes that outlived the shutdown. Linux only (``/proc``).
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import signal
import sys
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Final

os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"

import ray
from ray._private import ray_constants
from ray.cluster_utils import Cluster

from tools.netns import NetAudit, exit_unless_loopback_namespace, require_loopback_namespace

__all__ = [
    "FAST_HEALTH_CHECKS",
    "LOOPBACK",
    "QUIET_RAY",
    "RAY_AGENTS",
    "LoopbackCluster",
    "OffLoopbackError",
    "descendants",
    "sockets_off_loopback",
]

LOOPBACK: Final = "127.0.0.1"
FAST_HEALTH_CHECKS: Final = {
    "health_check_initial_delay_ms": 0,
    "health_check_period_ms": 100,
    "health_check_failure_threshold": 10,
    "task_retry_delay_ms": 100,
}
REPO_ROOT: Final = Path(__file__).resolve().parents[1]
RAY_AGENTS: Final = ("ray::DashboardAgent", "ray::RuntimeEnvAgent")
"""The process names of the agents a raylet starts beside its workers."""
QUIET_RAY: Final = {
    "RAY_USAGE_STATS_ENABLED": "0",
    # Ray's dashboard posts "usage stats disabled" to this URL on every start, even disabled:
    # point it at a closed port on loopback (refused at once, nothing leaves the machine).
    "RAY_USAGE_STATS_REPORT_URL": "http://127.0.0.1:9/",
}
"""Set for every process of the cluster: Ray's usage statistics off and their report kept on
loopback. The head node's dashboard also gets a ``HOME`` of its own (``_head_home``)."""
_BOOTSTRAP_CONFIG: Final = """\
# Written by tools.ray_cluster for a throwaway loopback cluster. Ray's dashboard reads
# ~/ray_bootstrap_config.yaml to learn which cloud it runs on; without the file it asks the
# cloud metadata servers (169.254.169.254, metadata.google.internal) instead (issue 27).
{}
"""


class OffLoopbackError(RuntimeError):
    """A process of the cluster reached for an address off loopback (the audit saw it)."""

    def __init__(self, attempts: Sequence[str]) -> None:
        self.attempts = list(attempts)
        shown = "; ".join(self.attempts[:5]) + (" ..." if len(self.attempts) > 5 else "")
        super().__init__(f"{len(self.attempts)} attempts to reach an address off loopback: {shown}")


def _require_loopback_mode() -> None:
    if ray_constants.ENABLE_RAY_CLUSTER:
        raise RuntimeError(
            "Ray was imported before RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 was set, so it would "
            "advertise this machine's interface address; import tools.ray_cluster (or set the "
            "variable) before anything imports ray"
        )


class LoopbackCluster:
    """``with LoopbackCluster(workers=2) as cluster:`` - a head and ``workers`` worker nodes.

    ``python_path`` directories are put on the nodes' ``PYTHONPATH`` (with the repository root)
    so that worker processes can import the code the tasks refer to.
    """

    def __init__(
        self,
        *,
        workers: int = 2,
        cpus_per_worker: float = 1,
        python_path: Sequence[Path | str] = (),
        object_store_mb: int = 80,
    ) -> None:
        self.workers = workers
        self.cpus_per_worker = cpus_per_worker
        self.python_path = [str(REPO_ROOT), *(str(p) for p in python_path)]
        self.object_store_bytes = object_store_mb * 1024 * 1024
        self.cluster: Cluster | None = None
        self.worker_nodes: list[Any] = []
        self.audit: NetAudit | None = None
        self._saved_environment: dict[str, str | None] = {}

    # ---------------------------------------------------------------- lifecycle

    def __enter__(self) -> LoopbackCluster:
        require_loopback_namespace("LoopbackCluster")
        _require_loopback_mode()
        if ray.is_initialized():
            raise RuntimeError("this process is already connected to a Ray cluster")
        self.audit = NetAudit()
        saved_path = os.environ.get("PYTHONPATH")
        environment = self.audit.environment([*self.python_path, *filter(None, [saved_path])])
        environment.update(QUIET_RAY)
        self._saved_environment = {name: os.environ.get(name) for name in environment}
        os.environ.update(environment)
        self.audit.arm()
        try:
            with _head_home(self.audit.root / "head-home"):
                self.cluster = Cluster(
                    initialize_head=True,
                    head_node_args={
                        "num_cpus": 0,
                        "node_ip_address": LOOPBACK,
                        "include_dashboard": False,
                        "object_store_memory": self.object_store_bytes,
                        "_system_config": dict(FAST_HEALTH_CHECKS),
                    },
                )
            for _ in range(self.workers):
                self.add_worker()
            ray.init(
                address=self.cluster.address,
                _node_ip_address=LOOPBACK,
                log_to_driver=False,
                configure_logging=False,
            )
        except BaseException:
            self.__exit__(*sys.exc_info())
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        started = set(descendants(os.getpid()))
        try:
            ray.shutdown()
            if self.cluster is not None:
                self.cluster.shutdown()
        finally:
            self.cluster = None
            self.worker_nodes = []
            for name, value in self._saved_environment.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
            self._saved_environment = {}
            _kill_survivors(started)
            attempts = self.off_loopback_attempts()
            if self.audit is not None:
                self.audit.close()
                self.audit = None
        if attempts and exc_type is None:
            raise OffLoopbackError(attempts)

    # ---------------------------------------------------------------- the audit

    def off_loopback_attempts(self) -> list[str]:
        """Every reach for an address off loopback that a process of the cluster (or this
        driver, while the cluster is up) made so far, one line each, naming the address."""
        return [] if self.audit is None else [str(a) for a in self.audit.attempts()]

    # ---------------------------------------------------------------- nodes

    def add_worker(self) -> Any:
        """Start one more worker node on loopback and wait until it is alive.

        Main thread only: Ray's node start installs signal handlers, which fails anywhere else
        and leaves no node (issue 27). From async code, call it directly (it blocks the event
        loop for the node's start, about two seconds), not through ``asyncio.to_thread``.
        """
        assert self.cluster is not None
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError(
                "LoopbackCluster.add_worker must run in the main thread: Ray's node start "
                "installs signal handlers (call it directly, not through asyncio.to_thread)"
            )
        node = self.cluster.add_node(
            num_cpus=self.cpus_per_worker,
            node_ip_address=LOOPBACK,
            object_store_memory=self.object_store_bytes,
        )
        self.worker_nodes.append(node)
        return node

    def remove_worker(self, node: Any, *, with_workers: bool = False) -> None:
        """Kill the node's raylet and agents at once (``allow_graceful=False``).

        Its worker processes are not Ray's to kill: they notice that their raylet is gone and
        exit on their own, 1.7 to 10.5 s later here, and keep executing tools meanwhile (their
        writes are fenced by the run's lease). ``with_workers=True`` SIGKILLs them first, as
        when the whole machine is lost.
        """
        assert self.cluster is not None
        if with_workers:
            for pid in descendants(self.raylet_pid(node)):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        self.cluster.remove_node(node, allow_graceful=False)
        self.worker_nodes.remove(node)

    def process_ids(self) -> list[int]:
        """Every process this driver started for the cluster (nodes and their workers)."""
        return sorted(descendants(os.getpid()))

    @staticmethod
    def raylet_pid(node: Any) -> int:
        processes = node.all_processes[ray_constants.PROCESS_TYPE_RAYLET]
        return int(processes[0].process.pid)

    def worker_pids(self, node: Any, name_prefix: str = "ray::") -> list[int]:
        """Worker processes of ``node`` whose name starts with ``name_prefix``.

        Ray's agents (``ray::DashboardAgent``, ``ray::RuntimeEnvAgent``) are children of the
        raylet named ``ray::`` too, but they are not workers: killing one takes the whole node
        down (issue 27). They are never returned.
        """
        found = []
        for pid in descendants(self.raylet_pid(node)):
            command = _command(pid)
            if command.startswith(name_prefix) and not command.startswith(RAY_AGENTS):
                found.append(pid)
        return sorted(found)


@contextlib.contextmanager
def _head_home(home: Path) -> Iterator[None]:
    """``HOME`` while the head node starts: a directory holding an empty Ray bootstrap config.

    The head's dashboard runs Ray's usage-stats module (``include_dashboard=False`` loads
    exactly that one), which on start-up reads ``~/ray_bootstrap_config.yaml`` or, when there
    is none, probes the cloud metadata addresses - whatever ``RAY_USAGE_STATS_ENABLED`` says.
    The processes started meanwhile keep this ``HOME``; the driver gets its own back.
    """
    home.mkdir(parents=True, exist_ok=True)
    (home / "ray_bootstrap_config.yaml").write_text(_BOOTSTRAP_CONFIG, encoding="utf-8")
    saved = os.environ.get("HOME")
    os.environ["HOME"] = str(home)
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("HOME", None)
        else:
            os.environ["HOME"] = saved


# --------------------------------------------------------------------------- /proc helpers


def _parent_of(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="ascii", errors="replace")
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # The command name is in parentheses and may contain spaces: split after the last ')'.
    fields = stat.rsplit(")", 1)[-1].split()
    return int(fields[1]) if len(fields) > 1 else None


def _command(pid: int) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return ""
    return raw.replace(b"\0", b" ").decode("utf-8", errors="replace").strip()


def descendants(root: int) -> set[int]:
    """Process ids of every living descendant of ``root`` (children, their children, ...)."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            parent = _parent_of(int(entry))
            if parent is not None:
                parents[int(entry)] = parent
    found: set[int] = set()
    frontier = {root}
    while frontier:
        frontier = {pid for pid, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def _kill_survivors(pids: Iterable[int]) -> None:
    deadline = time.monotonic() + 5.0
    alive = [pid for pid in pids if Path(f"/proc/{pid}").exists()]
    while alive and time.monotonic() < deadline:
        time.sleep(0.1)
        alive = [pid for pid in alive if Path(f"/proc/{pid}").exists() and not _zombie(pid)]
    for pid in alive:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            continue
        print(f"tools.ray_cluster: killed leftover process {pid}", file=sys.stderr)


def _zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="ascii", errors="replace")
    except (FileNotFoundError, ProcessLookupError):
        return True
    return stat.rsplit(")", 1)[-1].split()[0] == "Z"


def _socket_inodes(pid: int) -> set[str]:
    inodes: set[str] = set()
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return inodes
    for name in names:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{name}")
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    return inodes


def _address(hex_address: str) -> tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, int]:
    host, port = hex_address.split(":")
    raw = bytes.fromhex(host)
    # /proc/net prints each 32-bit word of the address in host (little-endian) byte order.
    ordered = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    return ipaddress.ip_address(ordered), int(port, 16)


def _is_loopback(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped.is_loopback
    return address.is_loopback


def inet_sockets(pids: Iterable[int]) -> list[tuple[int, str, str, str, str]]:
    """``(pid, protocol, local, remote, state)`` for every TCP/UDP socket the processes hold."""
    owner: dict[str, int] = {}
    for pid in pids:
        for inode in _socket_inodes(pid):
            owner[inode] = pid
    rows = []
    for protocol in ("tcp", "tcp6", "udp", "udp6"):
        try:
            lines = Path(f"/proc/net/{protocol}").read_text(encoding="ascii").splitlines()[1:]
        except FileNotFoundError:
            continue
        for line in lines:
            fields = line.split()
            inode = fields[9]
            if inode in owner:
                rows.append((owner[inode], protocol, fields[1], fields[2], fields[3]))
    return rows


def sockets_off_loopback(pids: Iterable[int]) -> list[str]:
    """Each socket of ``pids`` bound to, listening on or connected to a non-loopback address.

    A wildcard bind (``0.0.0.0``, ``::``) counts as off loopback: it listens on every
    interface. An unconnected socket's remote address (all zeros, port 0) is ignored.
    """
    found = []
    for pid, protocol, local_hex, remote_hex, state in inet_sockets(pids):
        local, _ = _address(local_hex)
        remote, remote_port = _address(remote_hex)
        bad_local = not _is_loopback(local)
        bad_remote = not (remote.is_unspecified and remote_port == 0) and not _is_loopback(remote)
        if bad_local or bad_remote:
            found.append(
                f"pid {pid} ({_command(pid)[:60]}): {protocol} {local}->{remote} state {state}"
            )
    return found


def _main() -> Iterator[str]:  # pragma: no cover - a manual probe
    with LoopbackCluster(workers=2) as cluster:
        time.sleep(float(os.environ.get("PROBE_SECONDS", "0")))
        pids = cluster.process_ids()
        yield f"{len(pids)} processes, {len(inet_sockets(pids))} sockets"
        yield from sockets_off_loopback([*pids, os.getpid()]) or ["all on loopback"]
        assert cluster.audit is not None
        armed = cluster.audit.armed_pids()
        for pid in pids:
            yield f"  {pid} {'armed' if pid in armed else 'NOT ARMED'} {_command(pid)[:90]}"
        yield from cluster.off_loopback_attempts() or ["no attempt off loopback"]


if __name__ == "__main__":  # pragma: no cover
    exit_unless_loopback_namespace("python -m tools.ray_cluster")
    for line in _main():
        print(line)
