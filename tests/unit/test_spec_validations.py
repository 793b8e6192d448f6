"""SpecValidations: a spec is validated again only when its generation, object or policy changes."""

from __future__ import annotations

import copy
from typing import Any

from dsv4_operator.reconcile.validations import SpecValidations
from dsv4_operator.trust import TrustPolicy
from tests.support.builders import example_doc, set_path


def _owner(generation: int | None, uid: str = "u1", **changes: Any) -> dict[str, Any]:
    doc = example_doc()
    doc["metadata"] = {"name": "dsv4", "namespace": "ns", "uid": uid}
    if generation is not None:
        doc["metadata"]["generation"] = generation
    for dotted, value in changes.items():
        set_path(doc["spec"], dotted, value)
    return doc


def test_one_generation_reuses_its_validation_and_a_new_one_validates_the_new_spec() -> None:
    validations = SpecValidations()
    first = validations.of(_owner(1), None)
    assert first.valid and first.spec is not None
    # The same generation (a status write, a resync): the very same result.
    assert validations.of(copy.deepcopy(_owner(1)), None) is first
    # A new generation carries a new spec: here one the rules refuse.
    broken = validations.of(_owner(2, **{"engine.indexKDtype": "int3"}), None)
    assert broken is not first
    assert not broken.valid and any("indexKDtype" in f.field for f in broken.errors)


def test_a_namesake_another_policy_or_no_generation_is_validated_afresh() -> None:
    validations = SpecValidations()
    first = validations.of(_owner(1), None)
    assert validations.of(_owner(1, uid="u2"), None) is not first
    policy = TrustPolicy(canary_endpoints=("http://probe.example:8000",))
    again = validations.of(_owner(1, uid="u2"), policy)
    assert validations.of(_owner(1, uid="u2"), policy) is again
    assert validations.of(_owner(None), None) is not validations.of(_owner(None), None)


def test_forget_drops_the_deployments_validation() -> None:
    validations = SpecValidations()
    first = validations.of(_owner(1), None)
    validations.forget(("ns", "dsv4"))
    assert validations.of(_owner(1), None) is not first
