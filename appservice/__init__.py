"""The Matrix side of the Message Node: the appservice HTTP API and the homeserver client."""
