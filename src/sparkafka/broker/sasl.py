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
import hmac
import os
import stat
from collections.abc import Iterable, Sequence
from pathlib import Path

from sparkafka.broker.config import SaslUser
from sparkafka.broker.protocol import ApiKey

MECHANISMS = ["PLAIN"]
# Users given in the environment, in the users file's format: a process's environment is readable by
# its own user and root only, unlike its arguments, which every user sees in the process list.
SASL_USERS_ENV = "SPARKAFKA_BROKER_SASL_USERS"


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
    if not credentials_match(users, username, password):
        return "Authentication failed: Invalid username or password"
    if authorization_id and authorization_id != username:
        return "Authentication failed: Client requested an authorization id that is different from username"
    return None


def credentials_match(users: Iterable[SaslUser], username: str, password: str) -> bool:
    # Compared in constant time, and against every user, so timing does not tell which part was wrong.
    # An empty password never matches, as Kafka's PLAIN refuses one.
    matched = False
    for user in users:
        same_name = hmac.compare_digest(user.username.encode(), username.encode())
        same_password = hmac.compare_digest(user.password.encode(), password.encode())
        matched |= same_name and same_password
    return matched and bool(password)


class SaslUsersError(ValueError):
    """A users file or ``SPARKAFKA_BROKER_SASL_USERS`` the broker cannot use; the message says where."""


def parse_users(text: str, source: str) -> list[tuple[SaslUser, str]]:
    """``USER:PASSWORD`` lines (blank lines and lines starting with ``#`` skipped), each with where
    it was found (``source, line N``). The password is the rest of the line after the first ``:``,
    taken exactly: only the line break is removed.

    Messages never repeat the line, which holds a password."""
    entries = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        where = f"{source}, line {number}"
        username, separator, password = line.partition(":")
        if not separator:
            raise SaslUsersError(f"{where}: expected USER:PASSWORD, found no ':'")
        if not username:
            raise SaslUsersError(f"{where}: the user name before ':' is empty")
        if not password:
            # Kafka's PLAIN refuses an empty password, so such a user could never log in.
            raise SaslUsersError(f"{where}: user {username!r} has an empty password")
        entries.append((SaslUser(username, password), where))
    return entries


def read_users_file(path: Path) -> list[tuple[SaslUser, str]]:
    """The users of a file in :func:`parse_users`'s format, refused, as ssh refuses a private key,
    when its permissions let anyone but its owner read or change it."""
    try:
        with open(path, "rb") as file:
            mode = os.fstat(file.fileno()).st_mode
            data = file.read()
    except OSError as error:
        raise SaslUsersError(f"cannot read the SASL users file {str(path)!r}: {error.strerror}") from None
    if os.name == "posix" and mode & 0o077:
        raise SaslUsersError(
            f"permissions {stat.S_IMODE(mode):04o} for the SASL users file {str(path)!r} are too open: "
            f"it holds passwords, so it must not be accessible by group or others (chmod 600 {path})"
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data[: error.start].count(b"\n") + 1
        raise SaslUsersError(f"{path}, line {line}: not UTF-8 text") from None
    return parse_users(text, str(path))


def merge_users(entries: Iterable[tuple[SaslUser, str]]) -> list[SaslUser]:
    """The users of every source, refusing a user given twice: with two passwords both would be
    accepted, which is never what was meant."""
    seen: dict[str, str] = {}
    users = []
    for user, where in entries:
        if user.username in seen:
            raise SaslUsersError(
                f"SASL user {user.username!r} is given twice: {seen[user.username]} and {where}"
            )
        seen[user.username] = where
        users.append(user)
    return users
