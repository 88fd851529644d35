"""Synapse's worker mode for the local stack: event persisters, the appservice push and the
federation sender each in a process of their own, the main process creating events and answering
the client API, all on one PostgreSQL database and talking over Redis and HTTP replication, as
Synapse's worker documentation describes.

Only the configuration is here; `synapse.SynapseProcess` starts and stops the processes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Synapse's name for its main process in `instance_map`.
MAIN = "main"
PERSISTER = "persister"
APPSERVICE_PUSH = "appservice1"
FEDERATION_SENDER = "federation1"


@dataclass(frozen=True)
class Worker:
    name: str
    # Its HTTP listener: replication (what the main process calls an event persister on) and
    # Synapse's /health, which says the worker is up.
    port: int


@dataclass(frozen=True)
class WorkerLayout:
    """Which workers a homeserver runs beside its main process, and where Redis is."""

    persisters: tuple[Worker, ...]
    appservice_push: Worker
    # The main process's replication listener (the workers call it).
    main_port: int
    federation_sender: Worker | None = None
    redis_host: str = "127.0.0.1"
    redis_port: int = 6379

    @classmethod
    def plan(
        cls,
        persisters: int,
        port: Callable[[], int],
        federation: bool = False,
        redis_host: str = "127.0.0.1",
        redis_port: int = 6379,
    ) -> WorkerLayout:
        if persisters < 1:
            raise ValueError("a homeserver with workers needs at least one event persister")
        return cls(
            persisters=tuple(Worker(f"{PERSISTER}{i + 1}", port()) for i in range(persisters)),
            appservice_push=Worker(APPSERVICE_PUSH, port()),
            main_port=port(),
            federation_sender=Worker(FEDERATION_SENDER, port()) if federation else None,
            redis_host=redis_host,
            redis_port=redis_port,
        )

    @property
    def workers(self) -> tuple[Worker, ...]:
        extra = (self.federation_sender,) if self.federation_sender is not None else ()
        return (*self.persisters, self.appservice_push, *extra)

    def shared_config(self, host: str) -> dict[str, Any]:
        """What the main process and every worker read from homeserver.yaml."""
        instances = {MAIN: self.main_port, **{w.name: w.port for w in self.workers}}
        config: dict[str, Any] = {
            "redis": {"enabled": True, "host": self.redis_host, "port": self.redis_port},
            "instance_map": {
                name: {"host": host, "port": port} for name, port in instances.items()
            },
            "stream_writers": {"events": [w.name for w in self.persisters]},
            "notify_appservices_from_worker": self.appservice_push.name,
        }
        if self.federation_sender is not None:
            config["federation_sender_instances"] = [self.federation_sender.name]
        return config

    def main_listener(self, host: str) -> dict[str, Any]:
        return _replication_listener(host, self.main_port)

    def worker_config(self, worker: Worker, host: str, log_config: Path) -> dict[str, Any]:
        """The worker's own file, read after homeserver.yaml (`-c homeserver.yaml -c <this>`)."""
        return {
            "worker_app": "synapse.app.generic_worker",
            "worker_name": worker.name,
            "worker_listeners": [_replication_listener(host, worker.port)],
            "worker_log_config": str(log_config),
        }


def _replication_listener(host: str, port: int) -> dict[str, Any]:
    return {
        "port": port,
        "bind_addresses": [host],
        "type": "http",
        "tls": False,
        "resources": [{"names": ["replication"], "compress": False}],
    }
