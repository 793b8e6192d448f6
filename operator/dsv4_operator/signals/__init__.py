"""The guard's signal I/O: the supervisor loops, the canary runner, Prometheus, leak-tap scrapes."""
