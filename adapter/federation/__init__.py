"""Federation: this domain's traffic with other reTHINK domains through Matrix federation.

links.py writes the rooms to peer domains, peer_traffic.py reads theirs (peer_feed.py, one
room's ordered feed; peer_origins.py, their senders' bounds; peer_requests.py, subscriptions
asked of peers), peers.py says who the peers are and how their nodes are reached, abroad.py is
the way abroad the ingress uses, and feature.py attaches all of it to the core. The core never
imports this package: it sees only the hooks of core/hooks.py and routing/way_abroad.py.
"""
