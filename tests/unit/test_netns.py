"""The loopback-only namespace check and the audit hook's judgement (issue 27), without Ray."""

from __future__ import annotations

import shlex
import socket
from typing import Any

import pytest
from tools import _net_audit_site, netns

from _infra import skip_unless_loopback_namespace

pytestmark = pytest.mark.unit


class _Socket:
    def __init__(self, family: int) -> None:
        self.family = family


INET = _Socket(socket.AF_INET)
INET6 = _Socket(socket.AF_INET6)
UNIX = _Socket(socket.AF_UNIX)


@pytest.mark.parametrize(
    ("event", "args", "seen"),
    [
        ("socket.connect", (INET, ("192.0.2.1", 80)), "192.0.2.1:80"),
        ("socket.connect", (INET, ("169.254.169.254", 80)), "169.254.169.254:80"),
        ("socket.connect", (INET, ("127.0.0.1", 6379)), None),
        ("socket.connect", (INET, ("127.8.9.10", 1)), None),
        ("socket.connect", (INET, ("0.0.0.0", 1)), None),
        ("socket.connect", (INET6, ("::1", 80, 0, 0)), None),
        ("socket.connect", (INET6, ("::ffff:127.0.0.1", 80, 0, 0)), None),
        ("socket.connect", (INET6, ("fd00::1", 443, 0, 0)), "[fd00::1]:443"),
        ("socket.connect", (INET, ("usage-stats.ray.io", 443)), "usage-stats.ray.io:443"),
        ("socket.connect", (INET, ("localhost", 80)), None),
        ("socket.connect", (UNIX, "/tmp/ray/session/raylet.sock"), None),
        ("socket.sendto", (INET, ("10.0.0.1", 53)), "10.0.0.1:53"),
        ("socket.sendmsg", (INET, None), None),
        (
            "socket.getaddrinfo",
            ("metadata.google.internal", 80, 0, 0, 0),
            "metadata.google.internal:80",
        ),
        ("socket.getaddrinfo", (b"192.0.2.7", 80, 0, 0, 0), "192.0.2.7:80"),
        ("socket.getaddrinfo", (None, 0, 0, 0, 0), None),
        ("socket.getaddrinfo", ("127.0.0.1", 8080, 0, 0, 0), None),
        ("socket.getaddrinfo", ("localhost", 8080, 0, 0, 0), None),
        ("socket.gethostbyname", ("example.org",), "example.org"),
        ("socket.gethostbyaddr", ("10.1.2.3",), "10.1.2.3"),
        ("socket.getnameinfo", (("10.1.2.3", 80), 0), "10.1.2.3"),
        ("socket.bind", (INET, ("0.0.0.0", 0)), None),
        ("open", ("/etc/hosts", "r", 0), None),
    ],
)
def test_the_hook_names_every_address_off_loopback_and_nothing_else(
    event: str, args: tuple[Any, ...], seen: str | None
) -> None:
    assert _net_audit_site.judge(event, args) == seen


def _namespace(
    monkeypatch: pytest.MonkeyPatch, interfaces: list[str], routes: list[str], up: bool
) -> list[str]:
    monkeypatch.setattr(netns, "_interfaces", lambda: interfaces)
    monkeypatch.setattr(netns, "_route_devices", lambda: routes)
    monkeypatch.setattr(netns, "_loopback_is_up", lambda: up)
    return netns.namespace_problems()


def test_only_lo_with_lo_routes_and_lo_up_is_a_loopback_only_namespace(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A fresh `unshare -n` namespace after `ip link set lo up`: IPv6 routes on lo only.
    assert _namespace(monkeypatch, ["lo"], ["lo", "lo", "lo"], up=True) == []
    assert netns.in_loopback_namespace()


def test_an_interface_or_a_route_beyond_lo_or_lo_down_is_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert _namespace(monkeypatch, ["eth0", "lo"], ["eth0", "lo"], up=True) == [
        "interfaces besides lo: eth0",
        "routes through eth0",
    ]
    assert _namespace(monkeypatch, ["lo"], ["tun0"], up=True) == ["routes through tun0"]
    assert _namespace(monkeypatch, ["lo"], [], up=False) == [
        "lo is down (run 'ip link set lo up' inside the namespace)"
    ]
    assert not netns.in_loopback_namespace()


def test_the_refusal_says_why_and_the_command_that_runs_it_inside_a_namespace(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _namespace(monkeypatch, ["eth0", "lo"], ["eth0"], up=True)
    command = "python -m tools.soak.run_soak --report 'it''s.md'"
    refusal = netns.namespace_refusal("run_soak --engine ray", command)
    assert refusal is not None
    assert "\n" not in refusal
    assert "interfaces besides lo: eth0" in refusal
    wrapped = refusal.split("Run it inside one: ", 1)[1]
    assert shlex.split(wrapped) == [
        "unshare",
        "-n",
        "bash",
        "-c",
        f"ip link set lo up && {command}",
    ]
    with pytest.raises(netns.NotInLoopbackNamespaceError, match="Run it inside one: unshare -n"):
        netns.require_loopback_namespace("LoopbackCluster", command)
    with pytest.raises(SystemExit) as exited:
        netns.exit_unless_loopback_namespace("tools.bench.ray_engines")
    assert exited.value.code == 2


def test_a_ray_test_outside_a_namespace_skips_with_the_command_and_fails_in_ci(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _namespace(monkeypatch, ["eth0", "lo"], ["eth0"], up=True)
    command = ".venv/bin/python -m pytest -q tests/integration/test_ray_engine.py"
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception) as skipped:
        skip_unless_loopback_namespace(what="a Ray cluster", command=command)
    assert f"run: unshare -n bash -c 'ip link set lo up && {command}'" in str(skipped.value)
    assert "\n" not in str(skipped.value)
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI must run this test"):
        skip_unless_loopback_namespace(what="a Ray cluster", command=command)
    _namespace(monkeypatch, ["lo"], ["lo"], up=True)
    skip_unless_loopback_namespace(what="a Ray cluster", command=command)  # no skip, no fail
