"""Each DSV4Deployment's spec for the guard supervisor: the reconcile passes' validation of it.

The watch cache reports every change of the object, its status too (each reconcile pass may
write one); only a new generation (or a new object of the same name) can carry a new spec, so
only then is the spec validated again, once for the guard and the passes alike: one parsed
spec per deployment is held, not two.
"""

from __future__ import annotations

from dsv4_operator.api.spec import DSV4DeploymentSpec
from dsv4_operator.kube.objects import Obj
from dsv4_operator.reconcile.validations import SpecValidations
from dsv4_operator.runtime.cache import Key
from dsv4_operator.trust import TrustPolicy


class OwnerSpecs:
    """The parsed spec of each deployment, from `validations` (the reconciler's) under
    `policy` (the operator's): the same object until the generation changes."""

    def __init__(
        self, validations: SpecValidations | None = None, policy: TrustPolicy | None = None
    ) -> None:
        self._validations = validations or SpecValidations()
        self._policy = policy

    def spec(self, owner: Obj) -> DSV4DeploymentSpec | None:
        """The owner's spec as the model; None when it does not parse (reconcile reports why).
        An object without a generation is parsed every time."""
        return self._validations.of(owner, self._policy).spec

    def forget(self, key: Key) -> None:
        self._validations.forget(key)
