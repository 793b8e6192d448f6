"""Reconcile a DSV4Deployment: gather the world (I/O), decide (pure), act (I/O)."""
