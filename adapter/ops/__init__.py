"""Live operations: the dashboard the node serves, and the worker process that keeps it current.

* `tap`             the node keeps the room events of each handled transaction in a spool
* `ingest`          the worker turns the spool into export rows (each event exactly once)
* `layout`          where the spool, export, aggregates and status live (both sides use it)
* `live_state`      the window's partials and open tables on disk, one generation per cycle
* `refresh`         the worker process: ingest, add the new rows to the window, publish, repeat
* `worker`          the node's side of it: starts, watches and stops that process
* `live_dashboard`  GET /dashboard and /dashboard/data.json, loopback or operator token
* `feature`         attaches all of it to the node's core (adapter/core/hooks.py)
"""
