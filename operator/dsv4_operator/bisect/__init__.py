"""Culprit bisection: the configuration delta, the ddmin search and probe outcomes (pure)."""
