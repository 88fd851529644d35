"""reTHINK addresses: the one spelling the node accepts, and the kinds of address there are.

An address names something a principal may hold (a runtime, a hyperty, a data object and its
streams, a user) or one of the node's services. Every decision about who may use an address
compares strings exactly, so two spellings of one address must never both get in: a host in
capitals, a trailing dot or an invisible character would otherwise name the same thing to a
reader and another thing to the node. Addresses are therefore checked once, where they enter
(a runtime's message, a service request's body, a peer's message, a runtimeURL), and refused
unless they are already written in the one canonical form; after that they are compared as
plain strings (docs/stub-protocol.md, "Addresses").
"""

from __future__ import annotations

import re
import unicodedata

# Schemes whose addresses the node never allocates to a runtime: a runtime's own URL, a stub's
# URL, the node's services, the global registry and users (held by verified identities).
RUNTIME_SCHEME = "runtime"
STUB_SCHEME = "hyperty-runtime"
SERVICE_SCHEMES = frozenset({"domain", "global"})
USER_SCHEME = "user"
RESERVED_SCHEMES = frozenset({RUNTIME_SCHEME, STUB_SCHEME, USER_SCHEME, *SERVICE_SCHEMES})

# <scheme>://<authority>: the scheme in lower case, as URLs define it.
_SHAPE = re.compile(r"([a-z][a-z0-9+.\-]{0,31})://([^/?#]*)")
# Space and the ASCII control characters: never part of an address.
_ASCII_INVISIBLE = re.compile(r"[\x00-\x20\x7f]")
# Unicode categories that show nothing (or move the text around) where they stand: controls
# (C0 and C1), format characters (zero-width spaces and joiners, bidirectional marks),
# surrogates, private use, unassigned code points, and every kind of space or line separator.
_INVISIBLE_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zs", "Zl", "Zp"})
# A name a runtime makes for itself: a random GUID (reTHINK runtime-core's generateGUID, and
# what the node's own allocations look like).
_GUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
# The opaque part of a runtimeURL: one path segment of URL-safe characters.
_RUNTIME_ID = re.compile(r"[A-Za-z0-9._~%\-]{1,128}")


def invisible_character(text: str) -> str | None:
    """The first character of ``text`` that a reader would not see, as ``U+XXXX``, or None."""
    if text.isascii():
        found = _ASCII_INVISIBLE.search(text)
        return None if found is None else f"U+{ord(found.group()):04X}"
    for char in text:
        if unicodedata.category(char) in _INVISIBLE_CATEGORIES:
            return f"U+{ord(char):04X}"
    return None


# A host as DNS writes it, in lower case: labels of ASCII letters, digits, hyphens (and the
# underscores some service names carry), joined by single dots. No port, no user part: a host
# with either names the same machine to a reader (and to reTHINK's runtime, which splits
# addresses with its own pattern) and another principal to an exact comparison.
_HOST = re.compile(
    r"[a-z0-9_](?:[a-z0-9_\-]{0,61}[a-z0-9_])?(?:\.[a-z0-9_](?:[a-z0-9_\-]{0,61}[a-z0-9_])?)*"
)
# A percent-escape of a character that needs none (letters, digits, - . _ ~) or of a path
# separator: either spells an address two ways, or hides a segment boundary.
_NEEDLESS_ESCAPE = re.compile(r"%(?:[46][1-9a-fA-F]|[57][0-9aA]|3[0-9]|2[dDeEfF]|5[cCfF]|7[eE])")
_ESCAPE = re.compile(r"%(?![0-9a-fA-F]{2})")


def host_problem(host: str) -> str | None:
    """Why ``host`` is not a host name in its one spelling, or None when it is."""
    if host.endswith("."):
        return f"{host!r}: write the host without a trailing dot"
    if host != host.lower():
        return f"{host!r}: write the host in lower case"
    if "@" in host:
        return f"{host!r}: an address holds no user part before its host"
    if ":" in host:
        return f"{host!r}: an address holds no port"
    if len(host) > 253 or not _HOST.fullmatch(host):
        return f"{host!r} is not a host name (ASCII letters, digits, '-' and '_', dot-separated)"
    return None


def _path_problem(path: str) -> str | None:
    if "\\" in path:
        return "an address holds no backslash"
    if "?" in path or "#" in path:
        return "an address holds no query or fragment"
    if _ESCAPE.search(path):
        return "a '%' in an address starts a two-digit escape"
    if _NEEDLESS_ESCAPE.search(path):
        return "escape in an address only what needs it (not letters, digits, - . _ ~ / \\)"
    if any(segment in (".", "..") for segment in path.split("/")):
        return "an address holds no '.' or '..' segment"
    return None


def spelling_problem(address: str) -> str | None:
    """Why ``address`` is not an address in its one canonical spelling, or None when it is.

    Canonical: ``<scheme>://<host>[/<path>]`` with scheme and host in lower case, the host a
    plain DNS name (no trailing dot, user part or port), no invisible character anywhere, and a
    path with no backslash, query, fragment, dot segment or needless escape. The path is kept as
    written otherwise (paths are case-sensitive). Each of those rules closes a second spelling
    that a URL parser (a browser's, or reTHINK's runtime splitting an address) reads as the
    same address while an exact comparison reads another."""
    shape = _SHAPE.match(address)
    if shape is None:
        return f"{address!r} is not an address: <scheme>://<host>/… with the scheme in lower case"
    authority = shape.group(2)
    if not authority:
        return f"{address!r} names no host"
    invisible = invisible_character(address)
    if invisible is not None:
        return f"an address must not hold invisible or control characters ({invisible})"
    problem = host_problem(authority) or _path_problem(address[shape.end() :])
    return None if problem is None else f"{address!r}: {problem}"


def scheme_of(address: str) -> str:
    return address.partition("://")[0]


def host_of(address: str) -> str:
    """The host of a canonical address (``user://gmail.com/alice`` → ``gmail.com``)."""
    rest = address.partition("://")[2]
    return rest.split("/", 1)[0]


def domain_of(address: str) -> str | None:
    """The reTHINK domain an address belongs to: ``hyperty://example.org/x`` and
    ``domain://registry.example.org`` are both ``example.org``."""
    scheme, sep, _ = address.partition("://")
    if not sep:
        return None
    host = host_of(address)
    if scheme == "domain":
        label, dot, parent = host.partition(".")
        if dot and label in _SERVICE_LABELS:
            return parent
    return host or None


_SERVICE_LABELS = frozenset({"msg-node", "registry", "idm"})


def runtime_url_problem(runtime_url: object, domain: str) -> str | None:
    """Why ``runtime_url`` cannot name a runtime of ``domain``, or None when it can.

    A runtimeURL is ``runtime://<domain>/<opaque id>``: in this domain, one path segment long,
    so that it is the parent of nothing but its own subtree."""
    if not isinstance(runtime_url, str) or not runtime_url:
        return "runtimeURL must be a non-empty string"
    try:
        runtime_url.encode()
    except UnicodeEncodeError:
        return "runtimeURL is not valid Unicode"
    problem = spelling_problem(runtime_url)
    if problem is not None:
        return f"runtimeURL: {problem}"
    prefix = f"{RUNTIME_SCHEME}://{domain}/"
    if not runtime_url.startswith(prefix) or not _RUNTIME_ID.fullmatch(runtime_url[len(prefix) :]):
        return (
            f"runtimeURL must be {prefix}<id>, the id one segment of at most 128 characters "
            "A-Z a-z 0-9 . _ ~ % -"
        )
    return None


def is_stub_url(address: str) -> bool:
    """Whether ``address`` is a stub's URL, ``hyperty-runtime://<host>/<kind>/<id>`` (a protocol
    stub's ``…/protostub/<n>``, a P2P stub's, or an address under one): never a bare host or a
    single segment, which would be the parent of every stub's URL (of that kind)."""
    scheme, sep, rest = address.partition("://")
    if scheme != STUB_SCHEME or not sep:
        return False
    segments = rest.split("/")[1:]
    return len(segments) >= 2 and all(segments[:2])


def is_self_made(address: str, domain: str) -> bool:
    """Whether ``address`` is ``<scheme>://<domain>/<GUID>``, an address of ``domain`` in the
    form a runtime makes for itself from a random GUID (any scheme but the reserved ones)."""
    scheme, sep, rest = address.partition("://")
    if not sep or scheme in RESERVED_SCHEMES:
        return False
    host, slash, name = rest.partition("/")
    return host == domain and bool(slash) and _GUID.fullmatch(name) is not None


# -- what an address is for ----------------------------------------------------------------------

CHANGES_SUFFIX = "/changes"
REGISTRATION_SUFFIX = "/registration"
SUBSCRIPTION_SUFFIX = "/subscription"
CHILDREN_INFIX = "/children/"
_STREAM_SUFFIXES = (CHANGES_SUFFIX, REGISTRATION_SUFFIX)


def is_stream_address(address: str) -> bool:
    """Whether ``address`` is a stream others may subscribe to: a data object's changes
    (``<object>/changes``) or children (``<object>/children/<name>``), or a hyperty's
    registration status (``<hyperty>/registration``). ``<object>/subscription`` is not one: it
    is the channel on which observers ask the object's reporter to let them in, and only the
    reporter may read what arrives there."""
    return address.endswith(_STREAM_SUFFIXES) or CHILDREN_INFIX in address


def stream_parent(address: str) -> str | None:
    """The object (or hyperty) a stream or request-channel address belongs to, or None."""
    for suffix in (CHANGES_SUFFIX, REGISTRATION_SUFFIX, SUBSCRIPTION_SUFFIX):
        if address.endswith(suffix):
            return address[: -len(suffix)] or None
    cut = address.find(CHILDREN_INFIX)
    return address[:cut] if cut > 0 else None
