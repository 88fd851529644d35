"""Configuration validation: errors name the offending key."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import BaseModel

from adapter.config import ConfigError, load_config, parse_config

TOKENS = {"as_token": "a" * 20, "hs_token": "h" * 20}


def minimal(**appservice: object) -> dict[str, object]:
    return {"appservice": {**TOKENS, **appservice}}


def error_of(raw: object, environ: dict[str, str] | None = None) -> str:
    with pytest.raises(ConfigError) as info:
        parse_config(raw, "cfg.yaml", environ=environ or {})
    return str(info.value)


def test_minimal_config_gets_documented_defaults() -> None:
    cfg = parse_config(minimal(), environ={})
    assert cfg.homeserver.url == "http://127.0.0.1:8008"
    assert cfg.appservice.listen.port == 8009
    assert cfg.appservice.url == "http://127.0.0.1:8009"
    assert cfg.stub.listen.port == 9090
    assert cfg.database.url == "sqlite:///var/rethink-mn.db"


def test_example_config_is_valid_and_complete() -> None:
    example = Path(__file__).parents[2] / "config.example.yaml"
    cfg = load_config(example, environ={})
    assert cfg.domain == "localhost"
    # Every key of the model appears in the example (it documents every key).
    text = example.read_text()
    for section in type(cfg).model_fields:
        model = getattr(cfg, section)
        if not isinstance(model, BaseModel):
            continue
        assert f"\n{section}:" in text, f"section {section} is not in config.example.yaml"
        for key in type(model).model_fields:
            assert f"{key}:" in text, f"{section}.{key} is not documented in config.example.yaml"
    for key in type(cfg.registry.builtin).model_fields:
        assert f"    {key}:" in text, f"registry.builtin.{key} is not documented"


def test_unknown_key_is_named() -> None:
    msg = error_of({**minimal(), "homeserver": {"url": "http://x", "colour": "blue"}})
    assert "homeserver.colour: unknown key" in msg


def test_wrong_type_is_named() -> None:
    msg = error_of({**minimal(), "stub": {"listen": {"port": "9090"}}})
    assert "stub.listen.port" in msg
    msg = error_of({**minimal(), "stub": {"max_frame_bytes": 12.5}})
    assert "stub.max_frame_bytes" in msg


def test_missing_token_is_named_with_its_environment_variable() -> None:
    msg = error_of({"appservice": {"as_token": "a" * 20}})
    assert "appservice.hs_token: missing" in msg
    assert "RETHINK_MN_HS_TOKEN" in msg


def test_bad_urls_are_named() -> None:
    assert "homeserver.url" in error_of({**minimal(), "homeserver": {"url": "localhost:8008"}})
    assert "homeserver.url" in error_of({**minimal(), "homeserver": {"url": "ftp://h"}})
    assert "homeserver.url" in error_of({**minimal(), "homeserver": {"url": "http://h:99999"}})
    assert "appservice.public_url" in error_of(minimal(public_url="not a url"))
    assert "database.url" in error_of({**minimal(), "database": {"url": "mysql://x/y"}})


def test_token_rules() -> None:
    assert "appservice.as_token" in error_of(
        {"appservice": {"as_token": "short", "hs_token": "h" * 20}}
    )
    assert "must differ" in error_of({"appservice": {"as_token": "x" * 20, "hs_token": "x" * 20}})


def test_top_level_must_be_a_mapping() -> None:
    assert "mapping" in error_of(["a", "b"])


def test_environment_overrides_secrets() -> None:
    env = {"RETHINK_MN_AS_TOKEN": "e" * 20, "RETHINK_MN_DATABASE_URL": "postgresql://db/x"}
    cfg = parse_config(minimal(), environ=env)
    assert cfg.appservice.as_token == "e" * 20
    assert cfg.database.url == "postgresql://db/x"
    # Tokens may come only from the environment.
    cfg = parse_config(
        {}, environ={"RETHINK_MN_AS_TOKEN": "e" * 20, "RETHINK_MN_HS_TOKEN": "f" * 20}
    )
    assert cfg.appservice.hs_token == "f" * 20


def test_file_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such file"):
        load_config(tmp_path / "absent.yaml", environ={})
    bad = tmp_path / "bad.yaml"
    bad.write_text("appservice: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad, environ={})


def test_the_builtin_registry_serves_while_no_registry_url_is_set() -> None:
    cfg = parse_config(minimal(), environ={})
    builtin = cfg.registry.builtin
    assert cfg.registry.uses_builtin
    assert (builtin.lifetime_seconds, builtin.max_lifetime_seconds) == (3600, 86400)
    assert (builtin.disconnected_grace_seconds, builtin.rest_api) == (3600, "read-only")
    external = parse_config({**minimal(), "registry": {"url": "http://registry:4567"}}, environ={})
    assert not external.registry.uses_builtin
    off = parse_config({**minimal(), "registry": {"builtin": {"enabled": False}}}, environ={})
    assert not off.registry.uses_builtin


def test_builtin_registry_settings_are_checked() -> None:
    msg = error_of(
        {
            **minimal(),
            "registry": {"builtin": {"lifetime_seconds": 7200, "max_lifetime_seconds": 60}},
        }
    )
    assert "registry.builtin: lifetime_seconds must not exceed max_lifetime_seconds" in msg
    msg = error_of({**minimal(), "registry": {"builtin": {"rest_api": "on"}}})
    assert "registry.builtin.rest_api" in msg
    msg = error_of({**minimal(), "registry": {"builtin": {"disconnected_grace_seconds": -1}}})
    assert "registry.builtin.disconnected_grace_seconds" in msg


def test_a_domain_on_several_processes_federates_through_one_named_process() -> None:
    cluster = {
        **minimal(),
        "database": {"url": "postgresql://127.0.0.1/x"},
        "domain": "a.example",
        "federation": {"peers": {"b.example": {"server_name": "b.example"}}},
    }
    assert "cluster.federation_process" in error_of({**cluster, "cluster": {"process": "p2"}})
    named = {"process": "p2", "federation_process": "p1"}
    p2 = parse_config({**cluster, "cluster": named}, environ={})
    assert not p2.cluster.federates_here
    p1 = parse_config({**cluster, "cluster": {**named, "process": "p1"}}, environ={})
    assert p1.cluster.federates_here
    assert parse_config(minimal(), environ={}).cluster.federates_here  # the only process
    assert "federation_process" in error_of(
        {**cluster, "cluster": {**named, "federation_process": "P 1"}}
    )


def test_lowering_only_a_node_wide_bound_still_starts() -> None:
    """A configuration written before the per-client bounds (e.g. `stub.max_connections:
    1000`, below the per-client default of 2,000) starts: a share left at its default is cut
    to its whole; one set above its whole is an error."""
    from adapter.config import QuotaConfig, StubConfig

    stub = StubConfig(max_connections=3, max_sessions=5)
    assert (stub.max_connections_per_client, stub.max_sessions_per_client) == (3, 5)
    quotas = QuotaConfig(addresses_total=10, subscriptions_total=20, marks_total=30)
    assert quotas.addresses_per_client == 10
    assert (quotas.subscriptions_per_client, quotas.marks_per_client) == (20, 30)
    with pytest.raises(ValueError, match="must not exceed"):
        StubConfig(max_connections=3, max_connections_per_client=4)
