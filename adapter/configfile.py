"""Writing configuration and registration files (comment-preserving for existing configs)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap

from appservice.registration import build_registration, new_token

from .config import ENV_OVERRIDES, ConfigError, NodeConfig, parse_config
from .private_files import FILE_MODE, write_private

HEADER = (
    "reTHINK Message Node configuration, written by `rethink-mn generate-registration`.\n"
    "Every key, with its default and meaning, is explained in config.example.yaml.\n"
)


def _yaml() -> YAML:
    yaml = YAML()
    yaml.indent(mapping=2, sequence=4, offset=2)
    yaml.preserve_quotes = True
    return yaml


def _set(doc: CommentedMap, dotted: str, value: Any) -> None:
    node = doc
    *parents, leaf = dotted.split(".")
    for part in parents:
        child = node.get(part)
        if not isinstance(child, dict):
            child = CommentedMap()
            node[part] = child
        node = child
    node[leaf] = value


def write_atomically(path: Path, text: str, mode: int = FILE_MODE) -> None:
    """Replace ``path`` in one step; secrets are written readable by the owner only, from the
    moment the file exists (see `write_private`)."""
    write_private(path, text, mode)


def _dump(doc: Any) -> str:
    import io

    out = io.StringIO()
    _yaml().dump(doc, out)
    return out.getvalue()


def update_config_file(path: Path, settings: dict[str, Any]) -> NodeConfig:
    """Create ``path`` or update the given dotted keys in it, keeping its comments and order.

    The result is validated before anything is written, so a bad value never lands on disk."""
    if path.exists():
        doc = _yaml().load(path.read_text(encoding="utf-8"))
        if doc is None:
            doc = CommentedMap()
        if not isinstance(doc, CommentedMap):
            raise ConfigError(f"{path}: the top level must be a mapping of keys")
    else:
        doc = CommentedMap()
        doc.yaml_set_start_comment(HEADER)
    for key, value in settings.items():
        _set(doc, key, value)
    text = _dump(doc)
    config = parse_config(YAML(typ="safe", pure=True).load(text), str(path), environ={})
    write_atomically(path, text)
    return config


def registration_for(config: NodeConfig) -> dict[str, Any]:
    a = config.appservice
    return build_registration(
        appservice_id=a.id,
        url=a.url,
        as_token=a.as_token,
        hs_token=a.hs_token,
        sender_localpart=a.sender_localpart,
        user_prefix=a.user_prefix,
        alias_prefix=a.alias_prefix,
        server_name=config.homeserver.server_name,
    )


def write_registration(config: NodeConfig, path: Path) -> None:
    write_atomically(path, _dump(registration_for(config)))


def generate_registration(
    config_path: Path, registration_path: Path, overrides: dict[str, Any]
) -> tuple[NodeConfig, list[str]]:
    """Fresh tokens into the config (created if absent) and a matching registration file.

    Returns the config and warnings (e.g. environment variables that would override the new
    tokens at run time and so break the match)."""
    settings: dict[str, Any] = {
        "appservice.as_token": new_token(),
        "appservice.hs_token": new_token(),
        **overrides,
    }
    existing_secret = None
    if config_path.exists():
        raw = YAML(typ="safe", pure=True).load(config_path.read_text(encoding="utf-8")) or {}
        stub = raw.get("stub") if isinstance(raw, dict) else None
        existing_secret = stub.get("session_secret") if isinstance(stub, dict) else None
    if not existing_secret:
        settings["stub.session_secret"] = new_token()
    config = update_config_file(config_path, settings)
    write_registration(config, registration_path)
    warnings = [
        f"${env} is set and overrides {'.'.join(key)} at run time; unset it or the homeserver "
        "and the node will disagree"
        for env, key in ENV_OVERRIDES.items()
        if key[0] == "appservice" and os.environ.get(env)
    ]
    return config, warnings
