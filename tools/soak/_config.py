"""Where the soak's model lives: the built-in policy server, or a real endpoint.

``SOAK_BASE_URL`` (an OpenAI-compatible API root such as ``http://127.0.0.1:8080/v1``) switches
the driver from its loopback policy server to that endpoint; ``SOAK_MODEL`` names the model
(default ``soak-policy``) and ``SOAK_API_KEY`` is sent as a Bearer token when set. The
variables are read from the process environment first and then from ``.env`` at the
repository root (the environment wins). The fault batch always uses the policy server: its
faults are triggered through the server's hooks.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

__all__ = ["DOTENV", "Endpoint", "endpoint_from_environment", "read_dotenv"]

DOTENV: Final = Path(__file__).resolve().parents[2] / ".env"


@dataclass(frozen=True, slots=True, kw_only=True)
class Endpoint:
    """``base_url`` ``None`` means: start the loopback policy server."""

    base_url: str | None
    model: str
    api_key: str | None


def read_dotenv(path: Path) -> dict[str, str]:
    """``KEY=VALUE`` lines of a ``.env`` file (comments, blanks and ``export`` tolerated)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    values: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, _, value = line.removeprefix("export ").partition("=")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        values[key.strip()] = value
    return values


def endpoint_from_environment(
    environ: Mapping[str, str] | None = None, dotenv: Path = DOTENV
) -> Endpoint:
    merged = read_dotenv(dotenv)
    merged.update(os.environ if environ is None else environ)
    base_url = merged.get("SOAK_BASE_URL", "").strip() or None
    model = merged.get("SOAK_MODEL", "").strip() or "soak-policy"
    api_key = merged.get("SOAK_API_KEY", "").strip() or None
    return Endpoint(base_url=base_url, model=model, api_key=api_key)


def absolute_path(text: str) -> Path:
    """A command-line path made absolute once: the code scenario's worker processes run each
    task in their own working directory, so a relative path handed to them (the execution
    ledger's) would point somewhere else."""
    return Path(text).absolute()
