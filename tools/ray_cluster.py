"""A throwaway Ray cluster on this machine, on loopback only (tests, soak, benchmarks).

``LoopbackCluster`` starts a head node (``num_cpus=0``: it places nothing) and worker nodes
with ``ray.cluster_utils.Cluster`` - several nodes on one machine, each a real raylet with its
own worker processes, which is what Ray's own multi-node tests use - and connects this process
to it as the driver. Every node gets ``node_ip_address="127.0.0.1"``, and
``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` is set before Ray is imported: without both, Ray
advertises the machine's interface address and cluster traffic leaves loopback, which the
project's machines forbid. ``sockets_off_loopback`` reads ``/proc`` to prove it.

Health checks are fast (a dead node is noticed in about a second instead of about fifteen), as
in Ray's own tests. Leaving the ``with`` block shuts the cluster down and kills (by process id)
any of its processes that outlived the shutdown. Linux only (``/proc``).
"""

from __future__ import annotations

import ipaddress
import os
import signal
import sys
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Final

os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"

import ray
from ray._private import ray_constants
from ray.cluster_utils import Cluster

__all__ = [
    "FAST_HEALTH_CHECKS",
    "LOOPBACK",
    "LoopbackCluster",
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
        self._saved_path: str | None = None

    # ---------------------------------------------------------------- lifecycle

    def __enter__(self) -> LoopbackCluster:
        _require_loopback_mode()
        if ray.is_initialized():
            raise RuntimeError("this process is already connected to a Ray cluster")
        self._saved_path = os.environ.get("PYTHONPATH")
        parts = [*self.python_path, *([self._saved_path] if self._saved_path else [])]
        os.environ["PYTHONPATH"] = os.pathsep.join(parts)
        try:
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
            self.__exit__(None, None, None)
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
            if self._saved_path is None:
                os.environ.pop("PYTHONPATH", None)
            else:
                os.environ["PYTHONPATH"] = self._saved_path
            _kill_survivors(started)

    # ---------------------------------------------------------------- nodes

    def add_worker(self) -> Any:
        """Start one more worker node on loopback and wait until it is alive."""
        assert self.cluster is not None
        node = self.cluster.add_node(
            num_cpus=self.cpus_per_worker,
            node_ip_address=LOOPBACK,
            object_store_memory=self.object_store_bytes,
        )
        self.worker_nodes.append(node)
        return node

    def remove_worker(self, node: Any) -> None:
        """Kill every process of a worker node at once (``allow_graceful=False``)."""
        assert self.cluster is not None
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
        """Worker processes of ``node`` whose name starts with ``name_prefix``."""
        found = []
        for pid in descendants(self.raylet_pid(node)):
            if _command(pid).startswith(name_prefix):
                found.append(pid)
        return sorted(found)


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
        pids = cluster.process_ids()
        yield f"{len(pids)} processes, {len(inet_sockets(pids))} sockets"
        yield from sockets_off_loopback([*pids, os.getpid()]) or ["all on loopback"]


if __name__ == "__main__":  # pragma: no cover
    for line in _main():
        print(line)
