"""Which question is your attention metric answering? Conventions for the sink, on real models.

Run from the repository root::

    python -m case_studies.conventions run      # the full study: results/ and README tables
    python -m case_studies.conventions table    # the README tables from results/
    python -m case_studies.conventions quick    # a short run compared with golden/

See ``README.md`` beside this file for the protocol and the measured numbers.
"""
