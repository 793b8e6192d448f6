"""The guard's pure decision: policy, sequential test, OOM reading, tap-counter arithmetic."""
