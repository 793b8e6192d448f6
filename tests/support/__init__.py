"""Test support shared by the test modules of every tier: paths, builders of specs, worlds and
live objects, case tables, contracts and waits. No test module imports another test module;
what two of them share lives here (or, for one tier only, in that tier's `*_support.py`)."""
