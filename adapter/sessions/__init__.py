"""Runtime sessions: who is connected, and what is delivered to whom.

``registry`` knows the sessions and their life (attach, detach, resume, release, expiry);
``mailbox`` is one session's delivery: to its socket when live, kept for its resume otherwise,
numbered and acknowledged when its stub speaks the acknowledged protocol; ``upstream`` tracks
which of a stub's numbered messages are durable, so the node can acknowledge them.
"""
