"""The typed failures of an HTTP/1.1 exchange."""

from __future__ import annotations

from trajcore.domain.errors import InfrastructureError

__all__ = [
    "ClientClosed",
    "ConnectFailed",
    "ConnectionLost",
    "HTTPError",
    "MalformedMessage",
    "MessageTooLarge",
    "RequestTimedOut",
]


class HTTPError(InfrastructureError):
    """An HTTP/1.1 exchange failed; the subclass says how."""


class ConnectFailed(HTTPError):
    """No connection could be opened (refused, unreachable, no such socket, connect timeout)."""


class ConnectionLost(HTTPError):
    """The peer closed or reset the connection before the response was complete."""


class MalformedMessage(HTTPError):
    """The peer's bytes are not the HTTP/1.1 this module accepts."""


class MessageTooLarge(HTTPError):
    """A head or a body is larger than the limits allow."""


class RequestTimedOut(HTTPError):
    """The exchange did not complete within its ``timeout_s``."""


class ClientClosed(HTTPError):
    """The client was closed before or during the request."""
