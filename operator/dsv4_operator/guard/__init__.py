"""The guard: signals (I/O), policy (pure), and the evidence that drives rollback."""
