"""kopf registration and admission: thin handlers that hand work to the reconcile services."""
