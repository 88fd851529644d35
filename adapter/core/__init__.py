"""The core of the node (core.py) and the hooks through which features attach (hooks.py).

The walk of one routed message, for a reader finding their way:
  stub/endpoint.py (frame in) → routing/ingress.py (decided) → routing/lanes.py (leaves for
  Matrix; the homeserver persists the event) → routing/delivery.py → sessions/mailbox.py (to the
  destination's socket, or kept for its resume).
Events other nodes' runtimes send (federation) come in through appservice/server.py →
routing/inbound.py and the federation feature's consumers (federation/peer_traffic.py).
"""

from .core import Core, OutboxesFactory
from .hooks import Feature, Hooks

__all__ = ["Core", "Feature", "Hooks", "OutboxesFactory"]
