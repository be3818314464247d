"""Which question is your attention metric answering? Conventions for the sink, on real models.

Run from the repository root::

    python -m case_studies.conventions [--quick] [--out DIR]

See ``README.md`` beside this file for the protocol and the measured numbers.
"""
