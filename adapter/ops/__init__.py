"""Live operations: the dashboard the node serves, and the worker process that keeps it current.

* `layout`          where the worker keeps its export, aggregates and status (both sides use it)
* `refresh`         the worker process: export, Spark job over the window, publish, repeat
* `worker`          the node's side of it: starts, watches and stops that process
* `live_dashboard`  GET /dashboard and /dashboard/data.json, loopback or operator token
"""
