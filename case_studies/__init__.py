"""Runnable case studies composed from attncoda and attncoda.hooks (nothing imports them).

Each study is ``python -m case_studies.<name> run|table|quick`` (see :mod:`case_studies._study`).
"""

#: The studies with the run|table|quick entry point, results/, golden/ and README tables.
STUDIES = ("conventions", "pruning", "arach", "rpa")
