"""Sink-aware head pruning on real models; see README.md in this folder."""
