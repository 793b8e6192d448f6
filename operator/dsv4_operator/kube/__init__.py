"""The Kubernetes API seam: a small async REST client over httpx, and its errors."""
