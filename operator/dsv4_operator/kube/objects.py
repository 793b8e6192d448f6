"""A Kubernetes object as the API server sends and takes it: `Obj`, the one alias for it."""

from __future__ import annotations

from typing import Any

# An object as JSON (metadata, spec, status ...): what the client returns and applies.
Obj = dict[str, Any]
