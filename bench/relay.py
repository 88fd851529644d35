"""The ceiling baseline: the node's own code with Matrix taken out.

A runtime's messages are handed straight to the delivery code instead of going to its outbox
room and coming back from the homeserver: same stub endpoint, same MN services with the same
durable database writes, same routing table, no homeserver in between. What separates its figures
from the node's is exactly the cost of routing through Matrix.

    python bench/relay.py -c relay-config.yaml
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from collections import deque
from pathlib import Path

import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from adapter.config import load_config
from adapter.node import Node
from adapter.routing.carrier import Outgoing
from adapter.routing.delivery import Delivery
from adapter.sessions import Session


class DirectOutbox:
    """Stands in for a runtime's outbox: delivers in order, without Matrix."""

    def __init__(self, delivery: Delivery, session_id: int) -> None:
        self._delivery = delivery
        self._session_id = session_id
        self._queue: deque[Outgoing] = deque()
        self._task: asyncio.Task[None] | None = None

    def has_room_for(self, _size: int) -> bool:
        return True

    def push(self, item: Outgoing) -> None:
        self._queue.append(item)
        if self._task is None:
            self._task = asyncio.create_task(self._drain())

    async def _drain(self) -> None:
        try:
            while self._queue:
                item = self._queue.popleft()
                await self._delivery.deliver_text(item.text, self._session_id, None, item.to)
        finally:
            self._task = None


class DirectRelayNode(Node):
    async def start(self) -> None:
        self._direct_outboxes: dict[int, DirectOutbox] = {}
        await super().start()
        assert self.api is not None and self.sessions is not None and self.journal is not None
        self._direct = Delivery(self.api, self.table, self.sessions, self.journal, self.metrics)

    def outbox_for(self, session: Session) -> DirectOutbox:  # type: ignore[override]
        outbox = self._direct_outboxes.get(session.id)
        if outbox is None:
            outbox = self._direct_outboxes[session.id] = DirectOutbox(self._direct, session.id)
        return outbox

    async def _ping_homeserver(self) -> None:
        return  # not registered with the homeserver: nothing will be pushed to it


async def main(config_path: Path) -> None:
    node = DirectRelayNode(load_config(config_path))
    await node.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await node.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-c", "--config", type=Path, required=True)
    uvloop.run(main(parser.parse_args().config))
