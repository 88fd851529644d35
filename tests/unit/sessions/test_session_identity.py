"""Which connection may have a session, by identity key (issue 22): (iss, sub) for OpenID
Connect, never the e-mail; how long the node vouches for a session's identity, and the fresh
credential a runtime presents on its open socket."""

from __future__ import annotations

import math
import time

import pytest

from adapter.identity import Identity
from adapter.sessions.mailbox import Mailbox
from adapter.sessions.registry import SessionRefused, SessionRegistry
from adapter.sessions.session import Session

ISS = "https://idp.example"


def oidc(
    sub: str, email: str = "alice@gmail.com", exp: float | None = None, **kw: object
) -> Identity:
    return Identity(
        "user://gmail.com/alice" if email == "alice@gmail.com" else f"user://idp.example/{sub}",
        "idp.example",
        "oidc",
        True,
        email,
        expires_at=time.time() + 300 if exp is None else exp,
        issuer=str(kw.get("issuer", ISS)),
        subject=sub,
    )


def session(identity: Identity | None, protected: bool = True) -> Session:
    made = Session(
        1, "00aa", "runtime://mn.test/1", "@_rethink_1:hs", Mailbox(1, 1, lambda _m: None), 1
    )
    made.identity = identity
    made.protected = protected
    return made


def test_without_the_session_token_only_the_same_key_resumes() -> None:
    victim = session(oidc("victim"))
    # Same e-mail (and so the same user URL), another subject or issuer: refused.
    for other in (oidc("attacker"), oidc("victim", issuer="https://other.example")):
        assert other.user_id == victim.identity.user_id  # type: ignore[union-attr]
        with pytest.raises(SessionRefused):
            SessionRegistry._admit_without_token(victim, other)
    with pytest.raises(SessionRefused):
        SessionRegistry._admit_without_token(victim, None)
    SessionRegistry._admit_without_token(victim, oidc("victim", email="new@example.org"))


def test_with_the_session_token_the_identity_still_does_not_change_hands() -> None:
    victim = session(oidc("victim"))
    with pytest.raises(SessionRefused):
        SessionRegistry._admit_with_token(victim, oidc("attacker"))
    SessionRegistry._admit_with_token(victim, oidc("victim"))
    SessionRegistry._admit_with_token(victim, None)  # anonymous mode: the token suffices
    # A session kept by an older node (its identity has no key): only its token resumes it,
    # and the credential presented with the token is then the session's identity.
    older = session(Identity("user://gmail.com/alice", "idp.example", "oidc", True, "a@gmail.com"))
    with pytest.raises(SessionRefused):
        SessionRegistry._admit_without_token(older, oidc("victim"))
    SessionRegistry._admit_with_token(older, oidc("anyone"))


def test_the_node_vouches_until_exp_and_a_fresh_credential_extends_it() -> None:
    now = time.time()
    alice = session(oidc("alice", exp=now - 1))
    assert alice.vouched_until == now - 1 and alice.identity_expired
    fresh = oidc("alice", exp=now + 600)
    SessionRegistry._reauthenticate_on_line(alice, fresh)
    assert alice.identity is fresh and alice.vouched_until == now + 600
    assert not alice.identity_expired
    # Another subject, same e-mail: refused, nothing changes.
    with pytest.raises(SessionRefused, match="another identity"):
        SessionRegistry._reauthenticate_on_line(alice, oidc("mallory", exp=now + 900))
    assert alice.identity is fresh
    # A session that proved nobody takes no identity on the way.
    anonymous = session(None)
    assert anonymous.vouched_until == math.inf and not anonymous.identity_expired
    with pytest.raises(SessionRefused, match="proved no identity"):
        SessionRegistry._reauthenticate_on_line(anonymous, fresh)
    assert anonymous.identity is None
    # Matrix identities have no known end.
    matrix = session(Identity("@a:hs", "hs", "matrix", True, "@a:hs"))
    assert matrix.vouched_until == math.inf
