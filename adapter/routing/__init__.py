"""Routing reTHINK messages through Matrix: decide, carry, deliver."""
