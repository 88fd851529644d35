"""Synthetic room-event exports with known answers: test data for tests/analytics/ and data for
bench/analytics_bench.py. Not part of the installed node.

* `world`          the fixed cast: domains, runtimes, hyperties, data objects, MN services
* `traffic`        one chunk of traffic as integer code arrays, with its ground truth
* `known_answers`  the expected aggregates, computed independently of the Spark job
* `export`         `SyntheticSpec`, `generate_export` and the command line; writes the export layout

Nothing is imported here: the parts load numpy, and `known_answers` the job's aggregates (Spark).
"""
