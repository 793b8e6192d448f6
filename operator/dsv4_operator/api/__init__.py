"""Typed API: spec and status models of DSV4Deployment, and CRD generation."""
