"""Vendored files are run by the test modules that import them, never collected on their own
(pytest's --doctest-modules would import every .py file here, with the original bindings)."""

collect_ignore_glob = ["*.py"]
