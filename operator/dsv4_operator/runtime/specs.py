"""Each DSV4Deployment's spec, parsed once per generation for the guard supervisor.

The watch cache reports every change of the object, its status too (each reconcile pass may
write one); only a new generation (or a new object of the same name) can carry a new spec, so
only then is the spec validated again.
"""

from __future__ import annotations

from dsv4_operator.api.spec import DSV4DeploymentSpec
from dsv4_operator.kube.objects import Obj
from dsv4_operator.runtime.cache import Key

# The object's uid and generation: what says that the spec may have changed.
_Stamp = tuple[str | None, int]


class OwnerSpecs:
    """The last parsed spec of each deployment, with the generation it was parsed for."""

    def __init__(self) -> None:
        self._parsed: dict[Key, tuple[_Stamp, DSV4DeploymentSpec | None]] = {}

    def spec(self, owner: Obj) -> DSV4DeploymentSpec | None:
        """The owner's spec as the model; None when it does not parse (reconcile reports why).
        An object without a generation is parsed every time."""
        meta = owner["metadata"]
        key = (meta.get("namespace") or "", meta["name"])
        generation = meta.get("generation")
        stamp = (meta.get("uid"), int(generation)) if generation is not None else None
        cached = self._parsed.get(key)
        if stamp is not None and cached is not None and cached[0] == stamp:
            return cached[1]
        try:
            spec: DSV4DeploymentSpec | None = DSV4DeploymentSpec.model_validate(
                owner.get("spec") or {}
            )
        except ValueError:
            spec = None
        if stamp is not None:
            self._parsed[key] = (stamp, spec)
        return spec

    def forget(self, key: Key) -> None:
        self._parsed.pop(key, None)
