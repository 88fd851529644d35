"""Where runtimes' stubs connect: the WebSocket endpoint, connections, resume tokens."""
