"""SASL/PLAIN authentication of a connection, in the order Kafka's SaslServerAuthenticator enforces.

Before a connection on a SASL listener is authenticated, each state accepts certain requests only:

1. ``HANDSHAKE_OR_VERSIONS`` (a new connection): ApiVersions or SaslHandshake. An ApiVersions
   answered without error moves to ``HANDSHAKE``; one answered with an error (an unsupported
   version, an invalid client software name) stays here, so the client can ask again.
2. ``HANDSHAKE``: SaslHandshake only.
3. A SaslHandshake naming a supported mechanism moves on: v0 to a raw, size-prefixed SASL token
   without a request header (``RAW_TOKEN``), v1 to ``AUTHENTICATE``, where SaslAuthenticate
   requests carry the tokens.
4. A PLAIN token either authenticates the connection, after which requests go to the broker's
   handlers as on any listener, or fails it: the answer names the reason and the connection closes.

Anything else closes the connection. In ``HANDSHAKE_OR_VERSIONS`` and ``HANDSHAKE`` no answer is
sent. In ``AUTHENTICATE`` Kafka first answers any request it can parse with that request's error
response carrying ILLEGAL_SASL_STATE (``IllegalSaslStateException``); this broker does so for
ApiVersions (any version: one it lacks is answered as v0) and SaslHandshake, the two other requests
a client sends while authenticating, and closes the connection on any other request unanswered.

Invariant: no request other than these reaches a handler before authentication succeeds.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence

from sparkafka.broker.config import SaslUser
from sparkafka.broker.protocol import ApiKey

MECHANISMS = ["PLAIN"]
# Kafka's sasl.server.max.receive.size default: the largest request before authentication.
SASL_MAX_RECEIVE_BYTES = 524288


class SaslState(enum.Enum):
    HANDSHAKE_OR_VERSIONS = enum.auto()
    HANDSHAKE = enum.auto()
    RAW_TOKEN = enum.auto()  # the next frame is a token, not a request
    AUTHENTICATE = enum.auto()
    COMPLETE = enum.auto()  # authenticated, or a listener without SASL

    def accepts(self, api_key: int) -> bool:
        return self is SaslState.COMPLETE or api_key in _ACCEPTED[self]


_ACCEPTED: dict[SaslState, frozenset[int]] = {
    SaslState.HANDSHAKE_OR_VERSIONS: frozenset({ApiKey.API_VERSIONS, ApiKey.SASL_HANDSHAKE}),
    SaslState.HANDSHAKE: frozenset({ApiKey.SASL_HANDSHAKE}),
    SaslState.RAW_TOKEN: frozenset(),
    SaslState.AUTHENTICATE: frozenset({ApiKey.SASL_AUTHENTICATE}),
}


def answered_out_of_order(state: SaslState, api_key: int) -> bool:
    """Whether a request refused in ``state`` is answered ILLEGAL_SASL_STATE before the connection
    closes, rather than closed unanswered."""
    return state is SaslState.AUTHENTICATE and api_key in (ApiKey.API_VERSIONS, ApiKey.SASL_HANDSHAKE)


def plain_authentication_error(users: Sequence[SaslUser], token: bytes) -> str | None:
    """Why a SASL/PLAIN token (RFC 4616: authzid NUL authcid NUL passwd) fails, or None if it is accepted.

    The checks and messages are those of Kafka's PlainSaslServer and PlainServerCallbackHandler."""
    parts = token.decode("utf-8", "replace").split("\x00")
    if len(parts) != 3:
        return f"Invalid SASL/PLAIN response: expected 3 tokens, got {len(parts)}"
    authorization_id, username, password = parts
    if not username:
        return "Authentication failed: username not specified"
    if not password:
        return "Authentication failed: password not specified"
    if not any(u.username == username and u.password == password for u in users):
        return "Authentication failed: Invalid username or password"
    if authorization_id and authorization_id != username:
        return "Authentication failed: Client requested an authorization id that is different from username"
    return None
