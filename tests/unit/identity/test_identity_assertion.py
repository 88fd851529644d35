"""Identity assertions in message bodies, in the shapes reTHINK runtimes send, held against the
session's verified identity; and the IdM connector built on it."""

from __future__ import annotations

import json
from typing import Any

import jwt
import pytest

from adapter.envelope import Message, parse
from adapter.identity import Identity, anonymous_identity, check_assertion
from adapter.identity.assertion import asserted_domains
from adapter.services.base import Requester
from adapter.services.idm import IdmService

ALICE_OIDC = Identity(
    user_id="user://gmail.com/alice",
    idp_domain="accounts.google.com",
    method="oidc",
    authenticated=True,
    username="alice@gmail.com",
    display_name="Alice",
    expires_at=2_000_000_000,
    issuer="https://accounts.google.com",
    subject="1",
)
ALICE_MATRIX = Identity(
    user_id="@alice:example.org",
    idp_domain="example.org",
    method="matrix",
    authenticated=True,
    username="@alice:example.org",
)
ANONYMOUS = anonymous_identity("runtime://example.org/7", "example.org")


def full_identity(user_url: str, username: str, idp: str) -> dict[str, Any]:
    """What the runtime's IdentityModule puts in body.identity for a logged-in user."""
    return {
        "userProfile": {
            "userURL": user_url,
            "username": username,
            "preferred_username": username.split("@")[0],
            "name": "Alice",
            "picture": "https://example.org/a.png",
        },
        "idp": {"domain": idp, "protocol": "OIDC"},
        "assertion": "eyJzdHVmZiI6MX0",
        "expires": 2_000_000_000,
    }


def id_token(**claims: Any) -> str:
    return jwt.encode({"iss": "https://accounts.google.com", **claims}, "k" * 32, "HS256")


@pytest.mark.parametrize(
    ("body", "verified", "outcome"),
    [
        # a logged-in runtime, the shape IdentityModule sends
        (
            {
                "identity": full_identity(
                    "user://gmail.com/alice", "alice@gmail.com", "accounts.google.com"
                )
            },
            ALICE_OIDC,
            "match",
        ),
        # an e-mail address's domain is case-insensitive (in ASCII), its local part is not
        ({"identity": {"userProfile": {"username": "alice@Gmail.COM"}}}, ALICE_OIDC, "match"),
        ({"identity": {"userProfile": {"username": "Alice@gmail.com"}}}, ALICE_OIDC, "mismatch"),
        ({"identity": "user://GMAIL.com/alice"}, ALICE_OIDC, "match"),
        ({"identity": "user://gmail.com/ALICE"}, ALICE_OIDC, "mismatch"),
        # letters that merely fold to the victim's (Kelvin sign, long s) are someone else
        ({"identity": "user://gmail.com/alice\u212a"}, ALICE_OIDC, "mismatch"),
        (
            {"identity": {"userProfile": {"username": "alice@gmail.co\u212a"}}},
            ALICE_OIDC,
            "mismatch",
        ),
        ({"identity": "user://gmail.com/al\u017fce"}, ALICE_OIDC, "mismatch"),
        # older runtimes: a bare user URL
        ({"identity": "user://gmail.com/alice"}, ALICE_OIDC, "match"),
        # the IdP's token instead of the profile
        ({"idToken": id_token(sub="1", email="alice@gmail.com")}, ALICE_OIDC, "match"),
        (
            {"idToken": id_token(sub="1", email="alice@gmail.com", email_verified=True)},
            ALICE_OIDC,
            "match",
        ),
        # the same e-mail for another subject is someone else, verified or not
        ({"idToken": id_token(sub="2", email="alice@gmail.com")}, ALICE_OIDC, "mismatch"),
        (
            {"idToken": id_token(sub="2", email="alice@gmail.com", email_verified=True)},
            ALICE_OIDC,
            "mismatch",
        ),
        # a Matrix-authenticated session asserting its user in any spelling
        (
            {"identity": {"userProfile": {"userURL": "user://example.org/alice"}}},
            ALICE_MATRIX,
            "match",
        ),
        ({"identity": {"userProfile": {"username": "@alice:example.org"}}}, ALICE_MATRIX, "match"),
        ({"identity": {"userProfile": {"username": "alice@example.org"}}}, ALICE_MATRIX, "match"),
        # someone else
        (
            {
                "identity": full_identity(
                    "user://gmail.com/bob", "bob@gmail.com", "accounts.google.com"
                )
            },
            ALICE_OIDC,
            "mismatch",
        ),
        # right user URL, wrong username: every identifier must hold
        (
            {
                "identity": {
                    "userProfile": {
                        "userURL": "user://gmail.com/alice",
                        "username": "bob@gmail.com",
                    }
                }
            },
            ALICE_OIDC,
            "mismatch",
        ),
        # right user, another IdP
        (
            {
                "identity": full_identity(
                    "user://gmail.com/alice", "alice@gmail.com", "evil.example"
                )
            },
            ALICE_OIDC,
            "mismatch",
        ),
        ({"idToken": id_token(sub="2", email="bob@gmail.com")}, ALICE_OIDC, "mismatch"),
        (
            {"identity": {"userProfile": {"userURL": "user://gmail.com/alice"}}},
            ALICE_MATRIX,
            "mismatch",
        ),
        # malformed assertions are refused, never crash
        ({"identity": ["user://gmail.com/alice"]}, ALICE_OIDC, "mismatch"),
        ({"identity": {"userProfile": "alice"}}, ALICE_OIDC, "mismatch"),
        ({"identity": {"userProfile": {"username": 42}}}, ALICE_OIDC, "mismatch"),
        (
            {"identity": {"userProfile": {"username": "alice@gmail.com"}, "idp": 7}},
            ALICE_OIDC,
            "mismatch",
        ),
        ({"idToken": "not-a-jwt"}, ALICE_OIDC, "mismatch"),
        ({"idToken": 12}, ALICE_OIDC, "mismatch"),
        # nothing asserted
        ({}, ALICE_OIDC, "absent"),
        ({"identity": None}, ALICE_OIDC, "absent"),
        ({"identity": {"userProfile": {"guid": "anonymous"}}}, ALICE_OIDC, "absent"),
        ({"identity": {"userProfile": {"guid": "b1c2d3"}}}, ANONYMOUS, "absent"),
        ({"identity": {"idp": {"domain": "gmail.com"}}}, ALICE_OIDC, "absent"),
        ({"accessToken": "whatever"}, ALICE_OIDC, "absent"),
        # an anonymous session cannot back any assertion
        ({"identity": {"userProfile": {"username": "alice@gmail.com"}}}, ANONYMOUS, "unverified"),
        ({"identity": {"userProfile": {"username": "alice@gmail.com"}}}, None, "unverified"),
    ],
)
def test_assertion_shapes(body: dict[str, Any], verified: Identity | None, outcome: str) -> None:
    check = check_assertion(body, verified)
    assert check.outcome == outcome, check.reason
    assert check.reason


def test_mismatch_reason_names_both_sides() -> None:
    check = check_assertion({"identity": "user://gmail.com/bob"}, ALICE_OIDC)
    assert "user://gmail.com/bob" in check.reason and "user://gmail.com/alice" in check.reason


def test_rethink_shape_round_trips_through_the_check() -> None:
    for identity in (ALICE_OIDC, ALICE_MATRIX):
        shaped = identity.to_rethink()
        assert shaped["userProfile"]["userURL"] == identity.user_url
        assert shaped["idp"]["domain"] == identity.idp_domain
        assert check_assertion({"identity": shaped}, identity).outcome == "match"
    assert ALICE_MATRIX.to_rethink()["userProfile"]["preferred_username"] == "alice"
    assert ALICE_OIDC.to_rethink()["expires"] == 2_000_000_000
    assert ANONYMOUS.to_rethink()["authenticated"] is False


# -- the IdM connector ---------------------------------------------------------------------------

IDM = "domain://idm.example.org"
RUNTIMES = {"runtime://example.org/alice": ALICE_OIDC, "hyperty://example.org/h-alice": ALICE_OIDC}
RUNTIMES["runtime://example.org/anon"] = ANONYMOUS


async def lookup(origin: str) -> Identity | None:
    if origin == "runtime://example.org/broken":
        raise RuntimeError("lookup failed")
    return RUNTIMES.get(origin)


def message(kind: str, body: dict[str, Any]) -> Message:
    frame = {
        "id": 1,
        "type": kind,
        "from": "runtime://example.org/bob/registry",
        "to": IDM,
        "body": body,
    }
    return parse(json.dumps(frame))


def validate(assertion: Any, origin: Any) -> Message:
    return message(
        "execute",
        {"method": "validateAssertion", "params": {"assertion": assertion, "origin": origin}},
    )


BOB = Requester(session_id=2, runtime_url="runtime://example.org/bob", identity=ALICE_MATRIX)


async def test_idm_read_answers_the_sessions_identity() -> None:
    service = IdmService(lookup)
    reply = await service.handle(message("read", {}), BOB)
    assert reply.code == 200
    assert reply.value == ALICE_MATRIX.to_rethink()
    unknown = await service.handle(message("read", {}), Requester(3, "runtime://example.org/x"))
    assert unknown.code == 404


async def test_idm_validates_assertions_of_other_runtimes() -> None:
    service = IdmService(lookup)
    shaped = full_identity("user://gmail.com/alice", "alice@gmail.com", "accounts.google.com")
    for assertion, origin in (
        (shaped, "hyperty://example.org/h-alice"),
        ("user://gmail.com/alice", "runtime://example.org/alice"),
        (id_token(sub="1", email="alice@gmail.com"), "runtime://example.org/alice"),
    ):
        reply = await service.handle(validate(assertion, origin), BOB)
        assert reply.code == 200, reply.desc
        assert reply.value["valid"] is True
        assert reply.value["identity"] == "alice@gmail.com"
        assert reply.value["contents"] == ALICE_OIDC.to_rethink()

    forged = full_identity("user://gmail.com/bob", "bob@gmail.com", "accounts.google.com")
    cases = [
        (validate(forged, "hyperty://example.org/h-alice"), 403),
        (validate(shaped, "runtime://example.org/anon"), 403),
        (validate(shaped, "runtime://example.org/nobody"), 404),
        (validate(shaped, "runtime://example.org/broken"), 500),
        (validate({"userProfile": {"guid": "anonymous"}}, "runtime://example.org/alice"), 400),
        (validate(None, "runtime://example.org/alice"), 400),
        (validate(shaped, None), 400),
        (message("execute", {"method": "validateAssertion", "params": "x"}), 400),
        (message("execute", {"method": "generateAssertion"}), 400),
        (message("delete", {}), 405),
    ]
    for request, code in cases:
        reply = await service.handle(request, BOB)
        assert reply.code == code, (request.body, reply)
        assert reply.desc


def test_a_name_that_only_folds_to_the_verified_one_is_another_identity() -> None:
    """Case folding maps the Kelvin sign to k, the long s to s and ß to ss: a name spelled with
    them is not the user whose name has the plain letters."""
    kris = Identity(
        user_id="user://kiss.example/kris",
        idp_domain="kiss.example",
        method="oidc",
        authenticated=True,
        username="kriss@kiss.example",
        issuer="https://kiss.example",
        subject="kris",
    )
    for forged in (
        "user://kiss.example/\u212aris",
        "user://\u212aiss.example/kris",
        "user://kiss.example/kri\u017f",
        "\u212ariss@kiss.example",
        "kri\u00df@kiss.example",
        "kriss@\u212aiss.example",
    ):
        check = check_assertion({"identity": forged}, kris)
        assert check.outcome == "mismatch", forged
    assert check_assertion({"identity": "kriss@KISS.example"}, kris).outcome == "match"


@pytest.mark.parametrize(
    "user_url",
    [
        "user://gmail.com\\@peer.example/alice",
        "user://gmail.com@peer.example/alice",
        "user://peer.example:443/alice",
        "user://peer.example/../gmail.com/alice",
    ],
)
def test_a_peer_vouches_for_no_user_url_in_a_second_spelling(user_url: str) -> None:
    """A user URL a runtime would read as another domain's (reTHINK splits addresses with its
    own pattern) is vouched for by nobody, whichever domain the node would have read."""
    body = {"assertedIdentity": True, "identity": {"userProfile": {"userURL": user_url}}}
    assert asserted_domains(body) is None


def test_a_peer_vouches_by_the_host_of_a_canonical_user_url() -> None:
    body = {"identity": {"userProfile": {"userURL": "user://peer.example/alice"}}}
    assert asserted_domains(body) == frozenset({"peer.example"})
