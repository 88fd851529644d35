"""Node configuration: one YAML file, validated at start, secrets overridable from the environment.

Every key is documented in ``config.example.yaml``. Validation errors name the offending key by its
dotted path (``appservice.hs_token``) so an operator can fix the file without reading code.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveInt,
    ValidationError,
    field_validator,
    model_validator,
)
from ruamel.yaml import YAML
from ruamel.yaml.error import YAMLError

from .addresses import host_problem
from .clients import parse_networks
from .web_hosts import url_host

# Secrets may live in the environment instead of the file (12-factor deployments, k8s secrets).
ENV_OVERRIDES: dict[str, tuple[str, ...]] = {
    "RETHINK_MN_AS_TOKEN": ("appservice", "as_token"),
    "RETHINK_MN_HS_TOKEN": ("appservice", "hs_token"),
    "RETHINK_MN_DATABASE_URL": ("database", "url"),
    "RETHINK_MN_SESSION_SECRET": ("stub", "session_secret"),
    "RETHINK_MN_POLICY_TOKEN": ("policy_api", "token"),
    "RETHINK_MN_DASHBOARD_TOKEN": ("dashboard", "token"),
    # One configuration file for all of a domain's node processes, each named here.
    "RETHINK_MN_PROCESS": ("cluster", "process"),
}

# Matrix user-id localparts: the historical grammar allowed by the spec for new ids.
_LOCALPART_RE = re.compile(r"^[a-z0-9._=\-/]+$")
_SERVER_NAME_RE = re.compile(r"^[A-Za-z0-9.\-]+(:[0-9]{1,5})?$|^\[[0-9A-Fa-f:.]+\](:[0-9]{1,5})?$")


class ConfigError(Exception):
    """The configuration cannot be used; the message names each offending key."""


def _http_url(value: str) -> str:
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"must be an http(s) URL with a host, got {value!r}")
    if parts.query or parts.fragment:
        raise ValueError("must not carry a query or fragment")
    try:
        parts.port  # noqa: B018 - raises on a malformed port
    except ValueError as exc:
        raise ValueError(f"has an invalid port: {exc}") from None
    return value.rstrip("/")


HttpUrl = Annotated[str, AfterValidator(_http_url)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


def _share_within(model: BaseModel, part: str, whole: str) -> None:
    """A per-client share may not exceed its node-wide whole. A share left at its default is
    cut to a smaller whole instead (a configuration that lowers only the node-wide bound, as
    one written before the per-client bounds existed, still starts); one set above it is an
    error."""
    if getattr(model, part) <= getattr(model, whole):
        return
    if part in model.model_fields_set:
        raise ValueError(f"{part} must not exceed {whole}")
    object.__setattr__(model, part, getattr(model, whole))


class ListenAddress(_Strict):
    host: str = "127.0.0.1"
    port: int = Field(ge=0, le=65535)


class HomeserverConfig(_Strict):
    url: HttpUrl = "http://127.0.0.1:8008"
    server_name: str = "localhost"
    request_timeout_seconds: float = Field(default=30.0, gt=0)
    max_retries: int = Field(default=5, ge=0, le=20)
    # How many event persisters (Synapse workers) the homeserver shards rooms' events over; the
    # lanes are created so that lane i's events go to persister i mod this, so that as many
    # lanes as persisters are persisted side by side. 1: one process persists every event.
    event_persisters: int = Field(default=1, ge=1, le=64)

    @field_validator("server_name")
    @classmethod
    def _server_name(cls, value: str) -> str:
        if not _SERVER_NAME_RE.match(value):
            raise ValueError(f"is not a valid Matrix server name: {value!r}")
        return value


class AppserviceConfig(_Strict):
    id: str = "rethink-mn"
    as_token: str = Field(min_length=16)
    hs_token: str = Field(min_length=16)
    sender_localpart: str = "_rethink_bot"
    user_prefix: str = "_rethink_"
    alias_prefix: str = "_rethink_"
    listen: ListenAddress = ListenAddress(port=8009)
    # Where the homeserver reaches us; goes into the registration file as `url`.
    public_url: HttpUrl | None = None
    # The names the homeserver and operators reach this listener by, besides public_url's
    # host (the dashboard, /metrics, the registry REST API). Requests naming any other host
    # are refused 421 (DNS rebinding); IP addresses and loopback names are always answered.
    public_hosts: list[str] = []
    max_body_bytes: int = Field(default=32 * 1024 * 1024, ge=1024)

    @field_validator("sender_localpart", "user_prefix", "alias_prefix")
    @classmethod
    def _localpart(cls, value: str) -> str:
        if not value or not _LOCALPART_RE.match(value):
            raise ValueError("may only contain a-z, 0-9, '.', '_', '=', '-' and '/'")
        return value

    @model_validator(mode="after")
    def _distinct_tokens(self) -> AppserviceConfig:
        if self.as_token == self.hs_token:
            raise ValueError("as_token and hs_token must differ")
        return self

    @property
    def url(self) -> str:
        return self.public_url or f"http://{self.listen.host}:{self.listen.port}"


class StubConfig(_Strict):
    listen: ListenAddress = ListenAddress(host="127.0.0.1", port=9090)
    max_frame_bytes: int = Field(default=1024 * 1024, ge=1024)
    max_connections: int = Field(default=10_000, ge=1)
    heartbeat_seconds: float = Field(default=30.0, gt=0)
    # permessage-deflate when a stub offers it: less bandwidth, much more CPU per message.
    compression: bool = False
    # A runtime that closed its socket without `disconnect` keeps its session this long.
    session_ttl_seconds: int = Field(default=24 * 3600, ge=1)
    # Sessions without a connection kept at most; beyond, the longest detached is released
    # early (counted in rethink_mn_sessions_evicted_total).
    max_detached_sessions: int = Field(default=100_000, ge=1)
    # Sessions (attached and detached) the node holds at most, and one client at most (a
    # client: the identity it proved, else the host it connects from, an IPv6 host's /64).
    # Beyond the total, a session that proved an identity displaces the next detached one to
    # go (sessions/eviction.py) if that one was never used; an anonymous one is refused (503).
    # docs/stub-protocol.md "Bounds".
    max_sessions: int = Field(default=100_000, ge=1)
    max_sessions_per_client: int = Field(default=2_000, ge=1)
    # Open stub sockets one client may hold (max_connections is the node's total).
    max_connections_per_client: int = Field(default=2_000, ge=1)
    # A socket that has not completed its handshake (the v1 `{cmd:'connect'}`) this long after
    # it opened is closed (counted in rethink_mn_stub_handshake_timeouts_total).
    handshake_seconds: float = Field(default=10.0, gt=0, le=300)
    # Proxies (addresses or networks, e.g. "10.0.0.0/8") whose X-Forwarded-For or Forwarded
    # header names the client: believed from these only, never from anyone else.
    trusted_proxies: list[str] = []
    # Pacing of what one connection sends: beyond these rates the node stops reading its
    # socket for a moment (TCP slows the sender); nothing is refused or dropped. The bursts
    # let a runtime send a batch at full speed. 0 turns a rate off.
    messages_per_second: float = Field(default=1_000.0, ge=0)
    messages_burst: int = Field(default=20_000, ge=1)
    bytes_per_second: float = Field(default=4 * 1024 * 1024, ge=0)
    bytes_burst: int = Field(default=128 * 1024 * 1024, ge=1024)
    # The same, for all the connections of one client together (the client as for
    # max_connections_per_client): the wait before a connection's next frame is the longer of
    # its own and its client's. 5,000 messages a second is a thousand runtimes behind one NAT
    # each sending five, yet half of what the node moves in all (~10,000 a second on two
    # cores of the bench machine), so one host cannot take most of it by opening many sockets.
    # The bursts are one connection's: a client with a single socket is paced as before.
    # 64 MiB a second is sixteen connections at their own byte rate. 0 turns a rate off.
    client_messages_per_second: float = Field(default=5_000.0, ge=0)
    client_messages_burst: int = Field(default=20_000, ge=1)
    client_bytes_per_second: float = Field(default=64 * 1024 * 1024, ge=0)
    client_bytes_burst: int = Field(default=128 * 1024 * 1024, ge=1024)
    # Signs the session tokens handed to stubs; generated by `generate-registration`. When
    # absent the node keeps a generated one in its database, so tokens survive its restarts.
    session_secret: str | None = Field(default=None, min_length=16)
    # A stub that connects with the v2 handshake without `hello=1` (NoMatrix-style third-party
    # stubs) never receives a session token, so anyone who knows its runtimeURL could take its
    # session over. `allow` accepts such stubs anyway; `refuse` answers them 401. Sessions that
    # were handed a token are protected either way (docs/stub-protocol.md).
    tokenless_sessions: Literal["allow", "refuse"] = "refuse"
    # Web pages (their `Origin`, scheme://host[:port], or "*" for any) whose scripts may open
    # stub connections. Unset: the node's own pages and pages served from loopback. Runtimes
    # outside browsers send no Origin and are not affected.
    allowed_origins: list[str] | None = None
    # The stub listener's address as runtimes reach it (http(s)://host[:port][/prefix]): the
    # protocol-stub descriptors give runtimes its WebSocket URL, ws(s)://…/stub/connect. Unset:
    # the address each request came to (its Host), right unless a proxy rewrites it.
    public_url: HttpUrl | None = None
    # Other names runtimes and browsers reach this listener by (its public host names, e.g.
    # behind a reverse proxy), besides public_url's host. Requests naming any other host are
    # refused 421 (DNS rebinding); IP addresses and loopback names are always answered.
    public_hosts: list[str] = []

    @field_validator("trusted_proxies")
    @classmethod
    def _proxies(cls, value: list[str]) -> list[str]:
        try:
            parse_networks(value)
        except ValueError as exc:
            raise ValueError(f"must list IP addresses or networks: {exc}") from None
        return value

    @model_validator(mode="after")
    def _per_client_within_total(self) -> StubConfig:
        _share_within(self, "max_sessions_per_client", "max_sessions")
        _share_within(self, "max_connections_per_client", "max_connections")
        return self

    @property
    def known_hosts(self) -> list[str]:
        """Every name this listener is known by: its public names and public_url's host."""
        named = [url_host(str(self.public_url))] if self.public_url else []
        return [*self.public_hosts, *named]


class OidcConfig(_Strict):
    # The identity provider: its `iss`; its JWKS comes from discovery unless jwks_uri is set.
    issuer: HttpUrl
    # The `aud` ID tokens must carry: this node's client id at the IdP.
    audience: str = Field(min_length=1)
    jwks_uri: HttpUrl | None = None
    algorithms: list[Literal["RS256", "RS384", "RS512", "ES256", "ES384", "PS256"]] = [
        "RS256",
        "ES256",
    ]


class AuthConfig(_Strict):
    # How runtimes prove who they are when their stub connects: `anonymous` (nothing to prove;
    # for local development), `matrix` (an access token of a user of this domain's homeserver,
    # checked with /account/whoami), `oidc` (an OpenID Connect ID token, checked against the
    # IdP's keys). docs/stub-protocol.md and the README's "Securing a domain".
    mode: Literal["anonymous", "matrix", "oidc"] = "anonymous"
    oidc: OidcConfig | None = None

    @model_validator(mode="after")
    def _oidc_configured(self) -> AuthConfig:
        if self.mode == "oidc" and self.oidc is None:
            raise ValueError("mode 'oidc' needs the auth.oidc section (issuer, audience)")
        return self


class PeerConfig(_Strict):
    # The Matrix server name of the homeserver serving that reTHINK domain; null: the domain
    # itself, checked with its /.well-known/matrix/server.
    server_name: str | None = None
    # Its node's appservice bot; null: @_rethink_bot:<server_name>.
    bot: str | None = None
    # Identity providers (their domains) whose users that domain's node may vouch for, beside
    # its own domain: a message it carries asserting anyone else arrives with
    # `assertedIdentity: false`. Example: ["accounts.google.com", "gmail.com"].
    identity_providers: list[str] = []
    # Subscriptions that domain's runtimes may hold to this domain's streams, all together.
    max_subscriptions: int = Field(default=100_000, ge=1)
    # Rooms that domain's node may have this node follow (it writes one per process, or per
    # event persister): an invitation beyond is refused and counted
    # (`rethink_mn_quota_refusals_total{quota="peer_rooms"}`). A room counts while that node
    # is in it: when it leaves, this node leaves too (federation/peer_traffic.py).
    max_rooms: int = Field(default=16, ge=1)
    # Sender ids of that domain's runtimes whose numbers this node keeps (in memory and in
    # `sender_marks`) to drop a message its node sends twice; beyond, the longest idle go
    # first (counted, `quota="peer_origins"`), as do those idle for `origin_idle_seconds`.
    max_origins: int = Field(default=10_000, ge=1)
    origin_idle_seconds: float = Field(default=3600.0, gt=0)

    @field_validator("server_name")
    @classmethod
    def _server_name(cls, value: str | None) -> str | None:
        if value is not None and not _SERVER_NAME_RE.match(value):
            raise ValueError(f"is not a valid Matrix server name: {value!r}")
        return value


class FederationConfig(_Strict):
    # The reTHINK domains this node exchanges traffic with (the allow list), and how to reach
    # each; list the same homeservers in Synapse's federation_domain_whitelist. A message to
    # any other domain is refused (403). docs/matrix-mapping.md, README "Connecting domains".
    peers: dict[str, PeerConfig] = {}
    # How long finding a peer's homeserver (its .well-known) may take before 504.
    discovery_timeout_seconds: float = Field(default=5.0, gt=0)
    # Flow control toward each peer (adapter/routing/flow.py): while its node confirms too
    # slowly to keep up, or the traffic to it is heavy, at most this many events it has not yet
    # confirmed are in flight; what waits meanwhile leaves in one event. 1 had the lowest tail
    # and homeserver CPU in a crowd across two domains on one machine (docs/benchmark.md); a
    # peer over a long round trip may want 2-4. 0 turns it off, and the node then sends peers
    # no confirmations either. Needs `receive_ephemeral: true` in the registration (generated
    # so).
    flow_window_events: int = Field(default=1, ge=0)
    # The longest the next event waits for a confirmation (the peer's node may be away).
    flow_max_hold_seconds: float = Field(default=1.0, gt=0, le=60)
    # Connections to the homeserver for what peers' rooms need (joining, reading them, their
    # media, confirmations): a pool of their own, so a peer whose media hangs never holds one
    # of those that carry this domain's own traffic.
    peer_connections: int = Field(default=8, ge=1, le=256)

    @property
    def enabled(self) -> bool:
        return bool(self.peers)


class QuotaConfig(_Strict):
    """What one runtime session may hold; beyond it a request is refused (429, or 413 for what
    waits for a runtime) and counted, instead of exhausting the node."""

    # Generous for a runtime (the benchmark's holds 30,000), far below what exhausts a node.
    addresses: int = Field(default=100_000, ge=1)
    subscriptions: int = Field(default=100_000, ge=1)
    learned_routes: int = Field(default=10_000, ge=1)
    # Deliveries kept for a runtime that is away or slow (in memory and in the database).
    waiting_bytes: int = Field(default=64 * 1024 * 1024, ge=64 * 1024)
    # Of that, what one sender may fill: one sender flooding an away runtime leaves room for
    # everyone else's messages to it. Unset: a quarter of waiting_bytes.
    waiting_bytes_per_sender: int | None = Field(default=None, ge=16 * 1024)
    # Bytes waiting for all the runtimes of one client (clients.py), and for all runtimes.
    waiting_bytes_per_client: int = Field(default=2 * 1024**3, ge=64 * 1024)
    waiting_bytes_total: int = Field(default=8 * 1024**3, ge=64 * 1024)
    # Addresses one client holds at most (over all its sessions), and the node in total.
    addresses_per_client: int = Field(default=100_000, ge=1)
    addresses_total: int = Field(default=1_000_000, ge=1)
    # Subscriptions one client holds at most (over all its sessions), and the node in total.
    subscriptions_per_client: int = Field(default=100_000, ge=1)
    subscriptions_total: int = Field(default=1_000_000, ge=1)
    # Routes learned from the addresses one client's runtimes speak from (over all its
    # sessions), and the node's in total: each is a row and an entry of the routing table.
    learned_routes_per_client: int = Field(default=100_000, ge=1)
    learned_routes_total: int = Field(default=1_000_000, ge=1)
    # Sender ids (origins) of this domain's runtimes whose dedupe marks the node keeps, per
    # client and in total: a session numbers in one per stub instance and one of the node's;
    # beyond, the oldest go (a resent message of theirs is delivered again).
    marks_per_client: int = Field(default=10_000, ge=1)
    marks_total: int = Field(default=500_000, ge=1)

    @model_validator(mode="after")
    def _shares_within_wholes(self) -> QuotaConfig:
        share = self.waiting_bytes_per_sender
        if share is not None and share > self.waiting_bytes:
            raise ValueError("waiting_bytes_per_sender must not exceed waiting_bytes")
        _share_within(self, "waiting_bytes_per_client", "waiting_bytes_total")
        _share_within(self, "addresses_per_client", "addresses_total")
        _share_within(self, "subscriptions_per_client", "subscriptions_total")
        _share_within(self, "learned_routes_per_client", "learned_routes_total")
        _share_within(self, "marks_per_client", "marks_total")
        return self

    @property
    def sender_share(self) -> int:
        """What one sender may have waiting for a runtime."""
        share = self.waiting_bytes_per_sender
        return share if share is not None else self.waiting_bytes // 4


class RoutingConfig(_Strict):
    # Rooms routed messages travel in, one event in flight each; every runtime's messages go to
    # one of them. More lanes help only a homeserver that persists events of several rooms at
    # once (Synapse with event-persister workers); one Synapse process persists one at a time,
    # and there one lane is fastest (docs/matrix-mapping.md has the measurements).
    lanes: int = Field(default=1, ge=1, le=64)
    # A batch larger than an event goes to the media repository; this caps one such batch.
    max_batch_bytes: int = Field(default=16 * 1024 * 1024, ge=64 * 1024)
    # Beyond this many bytes of messages waiting in a lane for the homeserver, the node stops
    # reading from the sockets of the runtimes sending into it (TCP slows the senders) ...
    max_queued_bytes_per_lane: int = Field(default=64 * 1024 * 1024, ge=1024 * 1024)
    # ... and if that lasts this long, refuses the message with 503 (a stub that numbers its
    # messages is not refused: it keeps them until they are acknowledged).
    backpressure_seconds: float = Field(default=10.0, gt=0)
    # A runtime whose socket cannot keep up is disconnected beyond this much unsent data. One
    # batch event may carry max_batch_bytes for a single runtime, so this must hold at least two.
    max_backlog_bytes_per_connection: int = Field(default=64 * 1024 * 1024, ge=64 * 1024)
    # Record MN-service requests, the node's own answers and delivery receipts in Matrix.
    journal: bool = True
    # Largest number of addresses one allocation request may ask for.
    max_allocation_block: int = Field(default=1000, ge=1)

    @model_validator(mode="after")
    def _backlog_holds_batches(self) -> RoutingConfig:
        if self.max_backlog_bytes_per_connection < 2 * self.max_batch_bytes:
            raise ValueError(
                "max_backlog_bytes_per_connection must be at least twice max_batch_bytes: one "
                "batch can be for a single runtime, which would be disconnected as too slow"
            )
        return self


class RateLimitConfig(_Strict):
    # 0 disables rate limiting.
    messages_per_second: float = Field(default=0.0, ge=0)
    burst: int = Field(default=0, ge=0)


class PolicyRule(_Strict):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, populate_by_name=True)

    type: str | None = None
    from_: str | None = Field(default=None, alias="from")
    to: str | None = None
    action: Literal["allow", "deny"] = "deny"
    code: int = Field(default=403, ge=400, le=599)
    reason: str | None = None


class PolicyConfig(_Strict):
    rate_limit: RateLimitConfig = RateLimitConfig()
    rules: list[PolicyRule] = []

    @model_validator(mode="before")
    @classmethod
    def _ownership_always_enforced(cls, data: Any) -> Any:
        """Older configuration files say ``enforce_sender_ownership: true``: still accepted.
        Who may speak from an address is no longer a setting (adapter/access.py decides it,
        always), so ``false`` is refused rather than silently ignored."""
        if isinstance(data, dict) and "enforce_sender_ownership" in data:
            if data["enforce_sender_ownership"] is not True:
                raise ValueError(
                    "enforce_sender_ownership can no longer be turned off: a runtime speaks "
                    "only from addresses it holds; remove the key"
                )
            data = {k: v for k, v in data.items() if k != "enforce_sender_ownership"}
        return data


class PolicyApiConfig(_Strict):
    # Bearer token of the operator's policy API (/_rethink/policy/...); null disables the API.
    token: str | None = Field(default=None, min_length=16)
    # Where `rethink-mn policy` reaches the API; default: the appservice listener.
    url: HttpUrl | None = None


class ConnectorConfig(_Strict):
    # Base URL of the service; null leaves the connector unconfigured.
    url: HttpUrl | None = None
    timeout_seconds: float = Field(default=5.0, gt=0)


class BuiltinRegistryConfig(_Strict):
    # Serve the domain registry from the node's own database while `registry.url` is null.
    enabled: bool = True
    # Lifetime of a registration that names no `expires`; a keep-alive starts it again.
    lifetime_seconds: int = Field(default=3600, ge=1)
    # A longer `expires` is cut to this (dev-registry-domain's EXPIRES_MAX).
    max_lifetime_seconds: int = Field(default=24 * 3600, ge=1)
    # A disconnected registration is still answered (408) this long, then removed (404).
    disconnected_grace_seconds: int = Field(default=3600, ge=0)
    # How often expired registrations are marked disconnected and stale ones removed.
    sweep_interval_seconds: float = Field(default=10.0, gt=0)
    # A runtime away this long (socket dropped, or session ended) has its registrations marked
    # disconnected; back sooner (a reload, a reconnect), nothing changes. 0: at once.
    presence_delay_seconds: float = Field(default=10.0, ge=0)
    # The registry's REST API on the appservice listener, under /registry/.
    rest_api: Literal["off", "read-only", "read-write"] = "read-only"
    # Entries the runtimes of one client (over all their sessions) may hold, and all runtimes:
    # a registration beyond is refused 429 / 503 and counted. Entries count until the sweep
    # removes them (their grace period after they expire or are deleted).
    entries_per_client: int = Field(default=20_000, ge=1)
    entries_total: int = Field(default=1_000_000, ge=1)

    @property
    def names_released_for_seconds(self) -> int:
        """How long the registry may still name an address after its runtime let it go: its
        longest lease, then the grace period of a disconnected entry."""
        return self.max_lifetime_seconds + self.disconnected_grace_seconds

    @model_validator(mode="after")
    def _lifetime_within_max(self) -> BuiltinRegistryConfig:
        if self.lifetime_seconds > self.max_lifetime_seconds:
            raise ValueError("lifetime_seconds must not exceed max_lifetime_seconds")
        _share_within(self, "entries_per_client", "entries_total")
        return self


class DomainRegistryConfig(ConnectorConfig):
    builtin: BuiltinRegistryConfig = BuiltinRegistryConfig()

    @property
    def uses_builtin(self) -> bool:
        """No external registry configured and the built-in one not switched off."""
        return self.url is None and self.builtin.enabled


class DatabaseConfig(_Strict):
    url: str = "sqlite:///var/rethink-mn.db"
    echo: bool = False
    # Whether every commit waits until it is on disk: see config.example.yaml.
    synchronous_commit: bool = False

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        scheme = value.split("://", 1)[0] if "://" in value else ""
        if scheme.split("+", 1)[0] not in ("sqlite", "postgresql", "postgres"):
            raise ValueError(
                f"must be a sqlite:/// or postgresql:// URL, got scheme {scheme or 'none'!r}"
            )
        return value


class DashboardConfig(_Strict):
    """The live ops dashboard (GET /dashboard, /dashboard/data.json on the appservice listener)
    and the background worker that keeps its figures current (adapter/ops/)."""

    enabled: bool = True
    # Run the worker as a child of this node, and keep the room events of the homeserver's
    # transactions for it (state_dir/spool). False: serve what is in state_dir (another
    # process of yours publishes there).
    worker: bool = True
    # Bearer token (or ?token= on the page) for requests that do not come from loopback; null:
    # the dashboard answers loopback only.
    token: str | None = Field(default=None, min_length=16)
    # Requests from 127.0.0.1/::1 need no token. Behind a reverse proxy on the same machine
    # every request comes from loopback: set this to false there.
    trust_loopback: bool = True
    # The worker exports what is new and runs the Spark job this often (at least; a slow run
    # makes it wait longer, see adapter/ops/refresh.py).
    refresh_seconds: float = Field(default=30.0, ge=1)
    # The figures cover this much of the most recent traffic.
    window_minutes: int = Field(default=60, ge=1, le=7 * 24 * 60)
    # Where the worker keeps its export and aggregates.
    state_dir: str = "var/dashboard"
    # The worker's Spark: one core of this machine by default, leaving the rest to the node and
    # the homeserver. Any master URL works: spark://host:7077, or sc://host:15002 (Connect).
    spark_master: str = "local[1]"
    spark_driver_memory: str = "1g"


_PROCESS_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,31}$")


class ClusterConfig(_Strict):
    """One domain served by several node processes, on one machine or several, against one
    homeserver and one PostgreSQL database (README "Several node processes")."""

    # This process's name, unique among the domain's processes and kept across its restarts
    # (its lanes, its recovery positions and the sessions it holds are named after it). None:
    # the domain's only process.
    process: str | None = None
    # How often the process tells the others it is alive ...
    heartbeat_seconds: float = Field(default=2.0, gt=0, le=60)
    # ... and how long without it before the others take it for gone.
    gone_after_seconds: float = Field(default=10.0, gt=0, le=600)
    # The one process that exchanges traffic with peer domains when the domain federates (a
    # room to a peer has one writer). The homeserver's push must reach it: the registration's
    # url names its appservice port. The others' messages to peers reach it through their lanes.
    federation_process: str | None = None

    @field_validator("process", "federation_process")
    @classmethod
    def _name(cls, value: str | None) -> str | None:
        if value is not None and not _PROCESS_NAME_RE.match(value):
            raise ValueError("must be 1-32 characters of a-z, 0-9, '_' and '-', starting alnum")
        return value

    @model_validator(mode="after")
    def _heartbeat_within(self) -> ClusterConfig:
        if self.gone_after_seconds <= 2 * self.heartbeat_seconds:
            raise ValueError("gone_after_seconds must exceed twice heartbeat_seconds")
        return self

    @property
    def enabled(self) -> bool:
        return self.process is not None

    @property
    def federates_here(self) -> bool:
        """Whether this process writes the rooms to peer domains (when the domain federates)."""
        return self.process is None or self.process == self.federation_process


class CollectorConfig(_Strict):
    # Python's garbage collector, run by the node on a schedule (adapter/heap.py says why):
    # each generation is collected once its count passes its threshold (as gc.set_threshold
    # counts), and no more often than its minimum interval.
    paced: bool = True
    thresholds: Annotated[list[PositiveInt], Field(min_length=3, max_length=3)] = [700, 10, 10]
    min_interval_seconds: Annotated[list[NonNegativeFloat], Field(min_length=3, max_length=3)] = [
        0.1,
        1.0,
        60.0,
    ]


class LoggingConfig(_Strict):
    level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    format: Literal["json", "console"] = "console"
    # A stall of the event loop longer than this is logged with the stack that held it
    # (adapter/stalls.py); 0 turns the watch off.
    report_loop_stalls_over_ms: NonNegativeInt = 250


class NodeConfig(_Strict):
    # reTHINK domain: hyperty://<domain>/..., domain://msg-node.<domain>/...
    domain: str = "localhost"
    homeserver: HomeserverConfig = HomeserverConfig()
    appservice: AppserviceConfig
    stub: StubConfig = StubConfig()
    auth: AuthConfig = AuthConfig()
    quotas: QuotaConfig = QuotaConfig()
    federation: FederationConfig = FederationConfig()
    database: DatabaseConfig = DatabaseConfig()
    routing: RoutingConfig = RoutingConfig()
    policy: PolicyConfig = PolicyConfig()
    policy_api: PolicyApiConfig = PolicyApiConfig()
    registry: DomainRegistryConfig = DomainRegistryConfig()
    global_registry: ConnectorConfig = ConnectorConfig()
    dashboard: DashboardConfig = DashboardConfig()
    cluster: ClusterConfig = ClusterConfig()
    gc: CollectorConfig = CollectorConfig()
    logging: LoggingConfig = LoggingConfig()

    @property
    def policy_api_url(self) -> str:
        """Where the policy API is served: ``policy_api.url`` or the appservice listener."""
        if self.policy_api.url:
            return self.policy_api.url
        listen = self.appservice.listen
        # A wildcard bind address is reachable on loopback from the same host.
        host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(listen.host, listen.host)
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{listen.port}"

    @model_validator(mode="after")
    def _cluster_needs(self) -> NodeConfig:
        if not self.cluster.enabled:
            return self
        if not self.database.url.startswith(("postgresql", "postgres")):
            raise ValueError(
                "cluster.process needs database.url on PostgreSQL: the processes share it"
            )
        if self.federation.enabled and self.cluster.federation_process is None:
            raise ValueError(
                "cluster.process with federation.peers needs cluster.federation_process: the "
                "one process that writes the rooms to peer domains (a room has one writer) and "
                "that the homeserver's push reaches"
            )
        return self

    @field_validator("domain")
    @classmethod
    def _domain(cls, value: str) -> str:
        # Every address of the domain carries it as its host, in the one spelling addresses
        # are accepted in (adapter/addresses.py).
        problem = host_problem(value)
        if problem is not None:
            raise ValueError(f"is not a domain name: {problem}")
        return value


def _format_errors(source: str, exc: ValidationError) -> str:
    lines = [f"{source}: invalid configuration"]
    for err in exc.errors():
        key = ".".join(str(p) for p in err["loc"]) or "(top level)"
        kind = err["type"]
        if kind == "missing":
            hint = [env for env, path in ENV_OVERRIDES.items() if ".".join(path) == key]
            msg = "missing" + (f" (set it in the file or in ${hint[0]})" if hint else "")
        elif kind == "extra_forbidden":
            msg = "unknown key"
        else:
            msg = err["msg"].removeprefix("Value error, ")
        lines.append(f"  {key}: {msg}")
    return "\n".join(lines)


def apply_env_overrides(raw: dict[str, Any], environ: Mapping[str, str]) -> dict[str, Any]:
    for env_name, path in ENV_OVERRIDES.items():
        value = environ.get(env_name)
        if value is None or value == "":
            continue
        node = raw
        for part in path[:-1]:
            child = node.get(part)
            if not isinstance(child, dict):
                child = {}
                node[part] = child
            node = child
        node[path[-1]] = value
    return raw


def parse_config(
    raw: Any, source: str = "config", environ: Mapping[str, str] | None = None
) -> NodeConfig:
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(
            f"{source}: the top level must be a mapping of keys, got {type(raw).__name__}"
        )
    raw = apply_env_overrides(raw, os.environ if environ is None else environ)
    try:
        return NodeConfig.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(_format_errors(source, exc)) from None


def load_config(path: Path, environ: Mapping[str, str] | None = None) -> NodeConfig:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(
            f"{path}: no such file (create one with `rethink-mn generate-registration`)"
        ) from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
    try:
        raw = YAML(typ="safe", pure=True).load(text)
    except YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    return parse_config(raw, str(path), environ)
