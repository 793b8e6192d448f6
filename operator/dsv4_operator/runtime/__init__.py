"""The operator's controller runtime: watch cache, work queue, leadership, and their wiring."""
