"""The reTHINK side of the Message Node: stub endpoint, MN services, routing, operations."""
