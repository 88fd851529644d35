"""The operator's message policies in reTHINK's message-node policy language (JACPoL): the
language compiled to predicates, the engine deciding each message, the rules' store and the
operator API that manages them."""

from .attributes import ATTRIBUTES, PolicyRequest
from .elements import ALGORITHMS, Algorithm, Effect, Element, compile_element, parse_algorithm
from .engine import Decision, RuleEngine
from .issues import Issue, PolicyValidationError

__all__ = [
    "ALGORITHMS",
    "ATTRIBUTES",
    "Algorithm",
    "Decision",
    "Effect",
    "Element",
    "Issue",
    "PolicyRequest",
    "PolicyValidationError",
    "RuleEngine",
    "compile_element",
    "parse_algorithm",
]
