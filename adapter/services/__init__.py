"""Message Node services: address allocation, subscription manager, registry/IdM connectors."""
