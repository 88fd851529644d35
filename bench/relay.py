"""The ceiling baseline: the node's own code with Matrix taken out.

A runtime's messages are handed straight to the delivery code instead of going through a lane
and the homeserver: same stub endpoint, same MN services with the same durable database writes,
same routing table and mailboxes, no homeserver in between. What separates its figures from the
node's is exactly the cost of routing through Matrix.

    python -m bench.relay -c relay-config.yaml
"""

from __future__ import annotations

import argparse
import asyncio
import signal
from collections import deque
from pathlib import Path

import uvloop

from adapter.config import load_config
from adapter.node import Node
from adapter.routing.delivery import Delivery
from adapter.routing.lanes import Outgoing
from adapter.sessions.session import Session


class DirectOutbox:
    """Stands in for a lane: delivers in order, without Matrix."""

    def __init__(self, delivery: Delivery) -> None:
        self._delivery = delivery
        self._queue: deque[Outgoing] = deque()
        self._task: asyncio.Task[None] | None = None

    def has_room_for(self, _size: int) -> bool:
        return True

    async def wait_for_room(self, _size: int, _timeout: float) -> bool:
        return True

    def push(self, item: Outgoing) -> None:
        self._queue.append(item)
        if self._task is None:
            self._task = asyncio.create_task(self._drain())

    async def _drain(self) -> None:
        try:
            while self._queue:
                item = self._queue.popleft()
                item.done()
                await self._delivery.deliver([item.routed], None)
        finally:
            self._task = None


class DirectOutboxes:
    def __init__(self, delivery: Delivery) -> None:
        self._delivery = delivery
        self._outboxes: dict[int, DirectOutbox] = {}
        self._node = DirectOutbox(delivery)

    def for_node(self) -> DirectOutbox:
        return self._node

    def for_session(self, session: Session) -> DirectOutbox:
        outbox = self._outboxes.get(session.id)
        if outbox is None:
            outbox = self._outboxes[session.id] = DirectOutbox(self._delivery)
        return outbox


async def main(config_path: Path) -> None:
    node = Node(load_config(config_path), outboxes=DirectOutboxes)
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
