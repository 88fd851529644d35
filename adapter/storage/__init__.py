"""Persistence: models, engine, migrations and the stores the node's services use."""
