"""The benchmarks and the fault suite, and what the tests share with them (the fault checker,
the proxies, the hostile runtime's verdict, results' provenance).

A package, so that its scripts and the tests import its modules by one name (``bench.X``) with
no edits of ``sys.path``: run a script as a module from the repository's root, e.g.
``.venv/bin/python -m bench.run --quick``; pytest finds the package through its ``pythonpath``
setting. Not part of the installed node."""
