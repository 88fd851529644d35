"""Registration output and `generate-registration`."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from ruamel.yaml import YAML

from adapter.config import load_config
from appservice.registration import build_registration

CLI = [sys.executable, "-m", "adapter.cli"]


def test_registration_claims_exclusive_namespaces_without_rate_limits() -> None:
    reg = build_registration(
        appservice_id="rethink-mn",
        url="http://127.0.0.1:8009",
        as_token="a" * 20,
        hs_token="h" * 20,
        sender_localpart="_rethink_bot",
        user_prefix="_rethink_",
        alias_prefix="_rethink_",
        server_name="example.org",
    )
    assert reg["rate_limited"] is False
    assert reg["receive_ephemeral"] is True  # peer nodes' read receipts pace federation
    assert reg["sender_localpart"] == "_rethink_bot"
    users = reg["namespaces"]["users"]
    aliases = reg["namespaces"]["aliases"]
    assert all(ns["exclusive"] for ns in users + aliases)
    user_re = re.compile(users[0]["regex"])
    assert user_re.fullmatch("@_rethink_0123abcd:example.org")
    assert not user_re.fullmatch("@_rethink_x:exampleXorg")  # the dot is escaped
    assert not user_re.fullmatch("@alice:example.org")
    assert re.compile(aliases[0]["regex"]).fullmatch("#_rethink_rt_ab:example.org")
    # Synapse matches a namespace from the start only: the end must be anchored too, or a
    # server whose name starts with ours falls into our exclusive namespace.
    for regex in (users[0]["regex"], aliases[0]["regex"]):
        for other in ("@_rethink_x:example.org.evil", "#_rethink_x:example.org.evil"):
            assert not re.compile(regex).match(other)
    assert not user_re.match("@_rethink_x:evil:example.org")


def run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], cwd=cwd, capture_output=True, text=True, check=False)


def test_generate_registration_creates_a_matching_config(tmp_path: Path) -> None:
    result = run(
        "-c",
        "config.yaml",
        "generate-registration",
        "-o",
        "reg.yaml",
        "--url",
        "http://10.0.0.5:8009",
        "--server-name",
        "example.org",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    reg = YAML(typ="safe").load((tmp_path / "reg.yaml").read_text())
    cfg = load_config(tmp_path / "config.yaml", environ={})
    assert reg["as_token"] == cfg.appservice.as_token
    assert reg["hs_token"] == cfg.appservice.hs_token
    assert reg["as_token"] != reg["hs_token"]
    assert reg["url"] == "http://10.0.0.5:8009"
    assert reg["namespaces"]["users"][0]["regex"].endswith(":example\\.org$")
    assert cfg.stub.session_secret
    assert (tmp_path / "config.yaml").stat().st_mode & 0o077 == 0  # secrets: owner only


def test_generate_registration_updates_an_existing_config_keeping_comments(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(
        "# my node\ndomain: example.org  # the reTHINK domain\n"
        "appservice:\n  as_token: old-token-aaaaaaaaaaaa\n  hs_token: old-token-hhhhhhhhhhhh\n"
        "stub:\n  session_secret: keep-this-secret-0000\n"
    )
    result = run("-c", "config.yaml", "generate-registration", "-o", "reg.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    text = config.read_text()
    assert "# my node" in text and "# the reTHINK domain" in text
    assert "old-token" not in text
    cfg = load_config(config, environ={})
    assert cfg.stub.session_secret == "keep-this-secret-0000"
    reg = YAML(typ="safe").load((tmp_path / "reg.yaml").read_text())
    assert reg["as_token"] == cfg.appservice.as_token


def test_generate_registration_refuses_bad_values_without_writing(tmp_path: Path) -> None:
    result = run(
        "-c", "config.yaml", "generate-registration", "--homeserver-url", "nope", cwd=tmp_path
    )
    assert result.returncode == 3
    assert "homeserver.url" in result.stderr
    assert not (tmp_path / "config.yaml").exists()


def test_cli_reports_config_errors_with_exit_code_3(tmp_path: Path) -> None:
    (tmp_path / "config.yaml").write_text("appservice:\n  as_token: short\n  bogus: 1\n")
    result = run("-c", "config.yaml", "db", "current", cwd=tmp_path)
    assert result.returncode == 3
    assert "appservice.bogus: unknown key" in result.stderr
    assert "appservice.hs_token: missing" in result.stderr
