"""The worker-mode configuration the local stack writes for Synapse."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from ruamel.yaml import YAML

from adapter.localstack.synapse import LocalStackError, SynapseSettings, write_homeserver_config
from adapter.localstack.workers import WorkerLayout
from adapter.routing.rooms import persister_of


def _layout(persisters: int, federation: bool = False) -> WorkerLayout:
    ports = itertools.count(9100)
    return WorkerLayout.plan(persisters, lambda: next(ports), federation=federation)


def _load(path: Path) -> dict[str, object]:
    return dict(YAML(typ="safe", pure=True).load(path.read_text()))


def test_the_shared_config_names_every_worker_and_its_duty(tmp_path: Path) -> None:
    layout = _layout(2, federation=True)
    settings = SynapseSettings(
        data_dir=tmp_path / "hs",
        server_name="hs.test",
        port=8008,
        registration_file=tmp_path / "registration.yaml",
        database_url="postgresql://postgres@127.0.0.1:5432/hs",
        workers=layout,
    )
    config = _load(write_homeserver_config(settings))
    assert config["instance_map"] == {
        "main": {"host": "127.0.0.1", "port": layout.main_port},
        "persister1": {"host": "127.0.0.1", "port": 9100},
        "persister2": {"host": "127.0.0.1", "port": 9101},
        "appservice1": {"host": "127.0.0.1", "port": 9102},
        "federation1": {"host": "127.0.0.1", "port": 9104},
    }
    assert config["stream_writers"] == {"events": ["persister1", "persister2"]}
    assert config["notify_appservices_from_worker"] == "appservice1"
    assert config["federation_sender_instances"] == ["federation1"]
    assert config["redis"] == {"enabled": True, "host": "127.0.0.1", "port": 6379}
    assert config["database"]["name"] == "psycopg2"  # type: ignore[index]
    # The main process listens for the workers' replication calls.
    ports = [listener["port"] for listener in config["listeners"]]  # type: ignore[attr-defined]
    assert ports == [8008, layout.main_port]
    assert settings.ports == (8008, layout.main_port, 9100, 9101, 9102, 9104)
    for worker in layout.workers:
        own = _load(settings.worker_config_file(worker))
        assert own["worker_app"] == "synapse.app.generic_worker"
        assert own["worker_name"] == worker.name
        assert own["worker_listeners"][0]["port"] == worker.port  # type: ignore[index]
        assert settings.worker_config_file(worker).stat().st_mode & 0o077 == 0


def test_workers_need_postgresql(tmp_path: Path) -> None:
    settings = SynapseSettings(
        data_dir=tmp_path / "hs",
        server_name="hs.test",
        port=8008,
        registration_file=tmp_path / "registration.yaml",
        workers=_layout(1),
    )
    with pytest.raises(LocalStackError, match="PostgreSQL"):
        write_homeserver_config(settings)


def test_a_layout_needs_a_persister() -> None:
    with pytest.raises(ValueError, match="at least one"):
        _layout(0)


def test_rooms_spread_over_persisters_as_synapse_shards_them() -> None:
    # Synapse's own rule (sha256 of the room id, little-endian, modulo the writers), checked
    # against Synapse itself in tests/integration/test_synapse_workers.py; here: it spreads.
    rooms = [f"!room{i}:hs.test" for i in range(400)]
    counts = [sum(persister_of(r, 4) == k for r in rooms) for k in range(4)]
    assert all(70 < c < 130 for c in counts), counts
    assert all(persister_of(r, 1) == 0 for r in rooms)
