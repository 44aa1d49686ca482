"""``GatewayConnection``: a ``GatewayModelClient`` on an HTTP client this object builds and closes.

The adapter's own rule stays: ``GatewayModelClient`` never builds an HTTP client, its caller
does (design 0030). This is such a caller, for code that does not want to configure httpx
itself: ``polyloop.Agent`` with a model string (design 0208). It keeps ``httpx`` inside
``polyloop.adapters`` (rule 5 of the architecture page).
"""

from __future__ import annotations

from types import TracebackType
from typing import Final

import httpx

from polyloop._common import check_bound
from polyloop.adapters._client import GatewayModelClient
from polyloop.adapters._settings import GatewaySettings
from polyloop.errors import PolyloopTypeError, PolyloopValueError

__all__ = ["CONNECT_TIMEOUT_SECONDS", "GatewayConnection"]

CONNECT_TIMEOUT_SECONDS: Final = 30.0
"""How long opening a connection may take. Reading a reply is bounded only when
``read_timeout_seconds`` is given: a slow model is not a broken one (design 0164); bound a
model call with ``RunRequest.model_call_timeout_seconds``. ``polyloop.Agent`` gives a finite
read bound (design 0225)."""


def _check_api_key(api_key: object, *, where: str) -> None:
    """Refuse an API key that cannot go into an ``Authorization`` header, never showing it.

    ``where`` names the source in the message (``"api_key="``, ``"OPENAI_API_KEY"``).
    """
    if not isinstance(api_key, str):
        raise PolyloopTypeError(
            f"the API key ({where}) must be a str, got {type(api_key).__name__}"
        )
    if not api_key:
        raise PolyloopValueError(
            f"the API key ({where}) is empty; pass the key, or leave it unset for a server "
            "that needs none"
        )
    if any(ch.isspace() or not ch.isprintable() or not ch.isascii() for ch in api_key):
        raise PolyloopValueError(
            f"the API key ({where}) contains whitespace, a control character or a non-ASCII "
            f"character ({len(api_key)} characters; the key itself is not shown), so it "
            "cannot be sent in an HTTP header: copy it again without the line break or spaces"
        )


class GatewayConnection:
    """A ``GatewayModelClient`` and the ``httpx.AsyncClient`` it runs on, owned together.

    ``api_key`` (``None``: no ``Authorization`` header, for a server that needs no key) is
    sent as ``Authorization: Bearer <key>``; it is checked here (``check_api_key``) and never
    appears in a message, a ``repr`` or the model client's ``parameters()``. Connecting may take
    ``CONNECT_TIMEOUT_SECONDS``; ``read_timeout_seconds`` bounds each wait for the next bytes of
    a reply (``None``, the default: no bound; on expiry the call fails with
    ``GatewayTimeoutError``, phase "read"). Close it with ``aclose()`` or
    ``async with``; a closed connection's model client cannot send anything.
    """

    __slots__ = ("_http", "_keyed", "_model_client", "_read_timeout")

    def __init__(
        self,
        settings: GatewaySettings,
        *,
        api_key: str | None = None,
        read_timeout_seconds: float | None = None,
    ) -> None:
        if not isinstance(settings, GatewaySettings):
            raise PolyloopTypeError(
                "GatewayConnection(settings) must be a polyloop.adapters.GatewaySettings, got "
                f"{type(settings).__name__}"
            )
        headers: dict[str, str] = {}
        if api_key is not None:
            _check_api_key(api_key, where="GatewayConnection(api_key=...)")
            headers["Authorization"] = f"Bearer {api_key}"
        check_bound(read_timeout_seconds, named="GatewayConnection(read_timeout_seconds=...)")
        self._keyed = api_key is not None
        self._read_timeout = read_timeout_seconds
        self._http = httpx.AsyncClient(
            headers=headers,
            timeout=httpx.Timeout(None, connect=CONNECT_TIMEOUT_SECONDS, read=read_timeout_seconds),
        )
        self._model_client = GatewayModelClient(client=self._http, settings=settings)

    @staticmethod
    def check_api_key(api_key: object, *, where: str) -> None:
        """Refuse (``PolyloopTypeError``/``PolyloopValueError``) an API key that cannot go into
        an ``Authorization`` header; the message names ``where`` and never shows the key."""
        _check_api_key(api_key, where=where)

    @property
    def model_client(self) -> GatewayModelClient:
        """The model client; usable until the connection is closed."""
        return self._model_client

    @property
    def read_timeout_seconds(self) -> float | None:
        """The bound on each wait for a reply's next bytes (``None``: no bound)."""
        return self._read_timeout

    @property
    def is_closed(self) -> bool:
        """Whether ``aclose`` has run."""
        return self._http.is_closed

    async def aclose(self) -> None:
        """Close the HTTP client and its connections (idempotent)."""
        await self._http.aclose()

    async def __aenter__(self) -> GatewayConnection:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        settings = self._model_client.settings
        key = "set" if self._keyed else "none"
        return (
            f"GatewayConnection(endpoint={settings.base_url!r}, model={settings.model!r}, "
            f"api_key={key})"
        )
