"""Skipping a test whose real infrastructure is missing, except in CI.

Tests that need a real server or program (PostgreSQL, a Ray cluster, a headless Chromium)
call ``skip_unless_available``. On a developer's machine without it, the test skips with one
line that says what is missing and how to install it. In CI (``CI=true``, which ``.ci/run``
sets and installs everything for), a missing part is a failure: CI must never pass by skipping.

Tests that start Ray also call ``skip_unless_loopback_namespace``: Ray reaches for addresses
outside the machine on every start (issue 27), so it runs only in a network namespace that has
nothing but loopback (``tools/netns.py``); ``.ci/run`` runs the whole suite in one.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

__all__ = ["in_ci", "skip_unless_available", "skip_unless_loopback_namespace", "tmpfs"]


def in_ci() -> bool:
    """True when the environment says it is CI (``CI=true``, as ``.ci/run`` sets)."""
    return os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}


def skip_unless_available(available: bool, *, what: str, how_to_install: str) -> None:
    """Skip (or, in CI, fail) unless ``available``; the message names ``what`` and the fix."""
    if available:
        return
    message = f"{what} is not available here; install it with: {how_to_install}"
    if in_ci():
        pytest.fail(f"CI must run this test, but {message}", pytrace=False)
    pytest.skip(message)


def skip_unless_loopback_namespace(*, what: str, command: str) -> None:
    """Skip (or, in CI, fail) unless this process is in a loopback-only network namespace.

    The one-line reason says why this namespace is not one and the exact command that runs
    ``command`` (the test's own pytest line) inside a new one.
    """
    from tools.netns import command_in_namespace, namespace_problems

    problems = namespace_problems()
    if not problems:
        return
    message = (
        f"{what} runs only in a loopback-only network namespace (here: {'; '.join(problems)}); "
        f"run: {command_in_namespace(command)}"
    )
    if in_ci():
        pytest.fail(f"CI must run this test, but {message}", pytrace=False)
    pytest.skip(message)


@contextlib.contextmanager
def tmpfs(size: str, *, mode: str = "0755", owner: str | None = None) -> Iterator[Path]:
    """A tmpfs of ``size`` (``mount -o size=``) mounted on a new directory for the block, so
    that a test can fill a disk for real; unmounted and removed afterwards. Mounting needs
    root: elsewhere the test skips (fails under ``CI=true``, which runs as root).
    ``owner``: a user to give the mount to (a database server's data directory)."""
    base = Path(tempfile.mkdtemp(prefix="polyloop-tmpfs-"))
    done = (
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size},mode={mode}", "tmpfs", str(base)],
            capture_output=True,
            check=False,
            timeout=30,
        )
        if os.geteuid() == 0
        else None
    )
    mounted = done is not None and done.returncode == 0
    try:
        skip_unless_available(
            mounted,
            what="a tmpfs mount (needs root)",
            how_to_install="run the tests as root, as CI does",
        )
        if owner is not None:
            shutil.chown(base, owner, owner)
        yield base
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(base)], check=False, timeout=30)
        with contextlib.suppress(OSError):
            base.rmdir()
