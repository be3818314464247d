"""ARACH hub tokens: paired evaluation and attention audit (see README.md)."""
