"""Secrets are not world-readable: what the local stack and the node write is owner-only from
the moment it exists, and an install from before that is tightened when `up` or `run` starts.

The writers are run under a permissive umask (0022, the usual default) on purpose: they must not
depend on the CLI's own umask, since the tests and the benchmark call them without it."""

from __future__ import annotations

import base64
import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from adapter.configfile import write_atomically
from adapter.localstack.synapse import SynapseProcess, write_homeserver_config
from adapter.localstack.up import (
    LocalDomain,
    ensure_config,
    homeserver_settings,
    make_state_private,
    two_domain_config,
    two_domain_settings,
)
from adapter.private_files import tighten_tree, write_private
from adapter.storage import migrate
from adapter.storage.database import create_engine, sqlite_files
from tests.support.modes import exposed, mode

CLI = [sys.executable, "-m", "adapter.cli"]


@pytest.fixture
def permissive_umask() -> Iterator[None]:
    previous = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(previous)


@pytest.fixture
def creations(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[tuple[str, int]]:
    """(path, mode) of every file created through os.open under tmp_path, the mode read from the
    descriptor at once: what anyone could have opened in the first instant."""
    seen: list[tuple[str, int]] = []
    real_open = os.open

    def spy(path: str | os.PathLike[str], flags: int, *args: object, **kwargs: object) -> int:
        fd = real_open(path, flags, *args, **kwargs)  # type: ignore[arg-type]
        if flags & os.O_CREAT and Path(path).is_relative_to(tmp_path):
            seen.append((os.fspath(path), stat.S_IMODE(os.fstat(fd).st_mode)))
        return fd

    monkeypatch.setattr(os, "open", spy)
    return seen


def test_a_private_file_is_owner_only_from_creation_even_over_leftovers(
    tmp_path: Path, permissive_umask: None, creations: list[tuple[str, int]]
) -> None:
    target = tmp_path / "registration.yaml"
    target.write_text("old")
    target.chmod(0o644)
    # A temporary file an interrupted run left behind, world-readable: not reused as it is.
    stale = tmp_path / ".registration.yaml.tmp"
    stale.write_text("stale")
    stale.chmod(0o644)
    write_atomically(target, "as_token: secret\n")
    assert target.read_text() == "as_token: secret\n"
    assert mode(target) == 0o600
    assert not stale.exists()
    assert creations and all(m == 0o600 for _, m in creations), creations
    # A missing directory is made private too; an existing one is not touched.
    write_private(tmp_path / "new" / "deeper" / "key", b"k")
    assert mode(tmp_path / "new") == mode(tmp_path / "new" / "deeper") == 0o700


async def test_the_local_stacks_writers_leave_nothing_for_others(
    tmp_path: Path, permissive_umask: None, creations: list[tuple[str, int]]
) -> None:
    """Both stacks `up` writes: one domain (config, registration, homeserver config, node
    database) and two domains (their configs, the federation CA and certificates)."""
    say: list[str] = []
    one = tmp_path / "one"
    one.mkdir()
    config_path = one / "config.yaml"
    state = one / "var"
    make_state_private(state, say.append, config_path)
    config = ensure_config(config_path, state, say.append)
    settings = homeserver_settings(config, state)
    write_homeserver_config(settings)
    homeserver = SynapseProcess(Path(sys.executable), settings)
    homeserver.generate_keys()
    signing_key = settings.signing_key_file.read_text()
    # The format Synapse reads: algorithm, key id, the 32-byte seed in unpadded base64.
    algorithm, key_id, seed = signing_key.split()
    assert (algorithm, len(key_id), len(base64.b64decode(seed + "="))) == ("ed25519", 6, 32)
    homeserver.generate_keys()
    assert settings.signing_key_file.read_text() == signing_key  # a key is never replaced
    await migrate.upgrade(config.database.url)
    database = sqlite_files(config.database.url)
    assert database[0].is_relative_to(state) and database[0].exists()

    two = tmp_path / "two" / "var"
    domains = (
        LocalDomain("a.localhost", 18008, 18448, 18009, 19090),
        LocalDomain("b.localhost", 18018, 18449, 18019, 19091),
    )
    make_state_private(two, say.append)
    configs = (
        two_domain_config(two, 0, say.append, domains),
        two_domain_config(two, 1, say.append, domains),
    )
    for settings in two_domain_settings(configs, two):
        write_homeserver_config(settings)
    for domain_config in configs:
        await migrate.upgrade(domain_config.database.url)

    assert exposed(state) == [] and exposed(two) == []
    assert mode(config_path) == 0o600
    for path in (
        state / "registration.yaml",
        state / "synapse" / "homeserver.yaml",
        state / "synapse" / "signing.key",
        state / "rethink-mn.db",
        two / "domain-a" / "config.yaml",
        two / "domain-b" / "registration.yaml",
        two / "domain-a" / "synapse" / "homeserver.yaml",
        two / "domain-b" / "synapse" / "federation.key",
        two / "federation-tls" / "ca.key",
        two / "domain-b" / "rethink-mn.db",
    ):
        assert mode(path) == 0o600, path
    assert "registration_shared_secret" in (state / "synapse" / "homeserver.yaml").read_text()
    # Nothing was created world-readable and chmodded later; nothing needed tightening.
    assert creations and all(m == 0o600 for _, m in creations), creations
    assert not [line for line in say if "owner-only" in line], say


def test_the_node_database_and_its_side_files_are_owner_only(
    tmp_path: Path, permissive_umask: None
) -> None:
    url = f"sqlite:///{tmp_path / 'state' / 'node.db'}"
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            conn.exec_driver_sql("CREATE TABLE probe (x)")
            conn.exec_driver_sql("INSERT INTO probe VALUES (1)")
            conn.commit()
            existing = [p for p in sqlite_files(url) if p.exists()]
            # Open in WAL mode: the database and the two files SQLite keeps beside it.
            assert {p.name for p in existing} >= {"node.db", "node.db-wal", "node.db-shm"}
            assert all(mode(p) == 0o600 for p in existing), [(p, oct(mode(p))) for p in existing]
    finally:
        engine.dispose()
    assert mode(tmp_path / "state") == 0o700


def test_an_existing_install_is_tightened_and_said_so(tmp_path: Path) -> None:
    state = tmp_path / "var"
    (state / "synapse" / "media_store").mkdir(parents=True)
    for directory in (state, state / "synapse", state / "synapse" / "media_store"):
        directory.chmod(0o755)
    secrets = {
        state / "synapse" / "homeserver.yaml": "registration_shared_secret: s\n",
        state / "rethink-mn.db": "",
        state / "rethink-mn.db-wal": "",
        state / "registration.yaml": "as_token: t\n",
        state / "synapse" / "signing.key": "ed25519 a_key k\n",
    }
    for path, text in secrets.items():
        path.write_text(text)
        path.chmod(0o644)
    script = state / "synapse" / "tool"
    script.write_text("#!/bin/sh\n")
    script.chmod(0o755)
    outside = tmp_path / "outside.txt"
    outside.write_text("not ours to change")
    outside.chmod(0o644)
    (state / "link").symlink_to(outside)
    config = tmp_path / "config.yaml"
    config.write_text("appservice: {as_token: t}\n")
    config.chmod(0o644)

    said: list[str] = []
    make_state_private(state, said.append, config)

    assert exposed(state) == []
    assert all(mode(path) == 0o600 for path in secrets)
    assert mode(script) == 0o700  # the owner keeps what the owner had
    assert mode(config) == 0o600
    assert mode(outside) == 0o644  # a symbolic link is not followed
    assert any("owner-only" in line and "var" in line for line in said), said
    assert any("config.yaml" in line for line in said), said
    # Once private, nothing more to do or to say.
    said.clear()
    make_state_private(state, said.append, config)
    assert said == []
    assert tighten_tree(state) == ([], [])


def _node_config(path: Path) -> None:
    path.write_text(
        "appservice:\n  as_token: private-test-as-token-0000\n"
        "  hs_token: private-test-hs-token-0000\n"
        "stub:\n  session_secret: private-test-session-secret-0000\n"
    )


def test_run_tightens_the_config_the_database_and_var(tmp_path: Path) -> None:
    """`rethink-mn run` on an install from before: the default database under ./var."""
    config = tmp_path / "config.yaml"
    _node_config(config)
    config.chmod(0o644)
    state = tmp_path / "var"
    state.mkdir(mode=0o755)
    state.chmod(0o755)
    database = state / "rethink-mn.db"
    database.write_text("")
    database.chmod(0o644)
    # The database is not migrated: `run` stops right after its checks, with no homeserver.
    result = subprocess.run(
        [*CLI, "run"], cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 1, result.stderr
    assert "db upgrade" in result.stderr
    assert mode(state) == 0o700
    assert mode(database) == 0o600
    assert mode(config) == 0o600
    assert "owner-only" in result.stderr and "rethink-mn.db" in result.stderr, result.stderr


def test_the_cli_creates_under_an_owner_only_umask(tmp_path: Path) -> None:
    """`db upgrade` creating a database beside a config it did not write: the database, its
    directory and SQLite's side files are owner-only, whatever the caller's umask."""
    config = tmp_path / "config.yaml"
    _node_config(config)
    result = subprocess.run(
        ["sh", "-c", f"umask 022 && exec {sys.executable} -m adapter.cli db upgrade"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert exposed(tmp_path / "var") == []
    assert mode(tmp_path / "var" / "rethink-mn.db") == 0o600
