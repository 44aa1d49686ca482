"""The audit hook as the cluster's processes get it: a generated ``sitecustomize`` (issue 27).

Without Ray and outside any namespace: the child process only asks ``getaddrinfo`` to parse a
numeric address (``AI_NUMERICHOST``: no lookup, nothing sent) and connects to a closed port on
loopback. The test of the hook against a real ``connect`` off loopback needs a loopback-only
namespace and is in ``test_ray_engine.py`` (in the driver and in a cluster worker).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import pytest
from tools.netns import NetAudit

pytestmark = pytest.mark.integration

CHILD = """
import socket
socket.getaddrinfo("192.0.2.9", 80, flags=socket.AI_NUMERICHOST)
probe = socket.socket()
try:
    probe.connect(("127.0.0.1", 9))
except OSError:
    pass
probe.close()
print("child done")
"""


@pytest.fixture
def audit() -> Iterator[NetAudit]:
    watched = NetAudit()
    try:
        yield watched
    finally:
        watched.close()


def test_a_child_process_given_the_environment_records_its_reach_off_loopback(
    audit: NetAudit,
) -> None:
    environment = {**os.environ, **audit.environment([os.environ.get("PYTHONPATH", "")])}
    child = subprocess.run(
        [sys.executable, "-c", CHILD],
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert child.returncode == 0, child.stderr
    assert child.stdout.strip() == "child done", "the hook must not change what the child does"
    attempts = audit.attempts()
    assert [(a.event, a.target) for a in attempts] == [("socket.getaddrinfo", "192.0.2.9:80")]
    (attempt,) = attempts
    assert attempt.pid != os.getpid()
    assert attempt.pid in audit.armed_pids()
    assert "192.0.2.9:80" in str(attempt)
    assert "from <string>:3" in str(attempt), "it names the caller"
    audit.forget()
    assert audit.attempts() == []


def test_the_driver_is_watched_while_armed_and_quiet_once_disarmed(audit: NetAudit) -> None:
    import socket

    audit.arm()
    socket.getaddrinfo("192.0.2.10", 80, flags=socket.AI_NUMERICHOST)
    audit.disarm()
    socket.getaddrinfo("192.0.2.11", 80, flags=socket.AI_NUMERICHOST)
    assert [(a.pid, a.target) for a in audit.attempts()] == [(os.getpid(), "192.0.2.10:80")]
    assert os.getpid() in audit.armed_pids()
