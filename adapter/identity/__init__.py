"""Who a runtime is: verified identities (Matrix accounts, OpenID Connect), identity assertions
in message bodies, and the IdM connector that answers runtimes about them."""

from .assertion import AssertionCheck, AssertionOutcome, check_assertion
from .model import (
    Identity,
    IdentityMethod,
    IdentityRejected,
    IdentityUnavailable,
    anonymous_identity,
    user_url_from_email,
)

__all__ = [
    "AssertionCheck",
    "AssertionOutcome",
    "Identity",
    "IdentityMethod",
    "IdentityRejected",
    "IdentityUnavailable",
    "anonymous_identity",
    "check_assertion",
    "user_url_from_email",
]
