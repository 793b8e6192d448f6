"""The playground's pure decisions: which process runs a container (real or stand-in) and
which claims its provisioner serves, on the manifests the operator and the chart render."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from dsv4_devcluster.playground_pods import (
    REAL_OPERATOR,
    REAL_ROUTER,
    STAND_IN_ENGINE,
    NotRunnable,
    classify,
)
from dsv4_devcluster.playground_storage import (
    PROVISIONER,
    STORAGE_CLASS,
    storage_class,
    volume_for_claim,
    wants_volume,
)
from dsv4_operator import cli
from tests.support.paths import REPO


def _rendered() -> list[dict[str, Any]]:
    """`dsv4 render` of the README's first deployment: what the operator creates."""
    result = CliRunner().invoke(cli.main, ["render", "-f", str(REPO / "examples/dsv4-hub.yaml")])
    assert result.exit_code == 0, result.output
    return [doc for doc in yaml.safe_load_all(result.output) if doc]


def test_every_container_the_operator_renders_is_run_real_or_as_the_engine_double() -> None:
    kinds = {}
    for manifest in _rendered():
        template = manifest.get("spec", {}).get("template", {}).get("spec")
        for container in (template or {}).get("containers", []):
            kinds[f"{manifest['metadata']['name']}/{container['name']}"] = classify(container)
    router = next(k for k in kinds if k.endswith("-router/router"))
    assert kinds.pop(router) == REAL_ROUTER
    engines = [k for k in kinds if k.endswith("/engine")]
    assert len(engines) == 2 and {kinds.pop(k) for k in engines} == {STAND_IN_ENGINE}
    assert set(kinds.values()) == {REAL_OPERATOR}  # the tap and the weights download
    assert any(k.endswith("/tap") for k in kinds) and any(k.endswith("/download") for k in kinds)


@pytest.mark.parametrize(
    "image",
    ["dsv4-operator", "registry.example.com/dsv4-operator:0.1.0", "r/o/dsv4-operator@sha256:ab"],
)
def test_the_operator_image_is_known_at_any_registry_tag_or_digest(image: str) -> None:
    assert classify({"image": image, "args": ["run"]}) == REAL_OPERATOR


def test_an_unknown_image_is_not_runnable_and_says_what_is() -> None:
    with pytest.raises(NotRunnable, match=r"busybox:1\.36.*operator's image"):
        classify({"image": "busybox:1.36", "command": ["sh", "-c", "true"]})
    with pytest.raises(NotRunnable):  # a look-alike name is not the operator's image
        classify({"image": "registry.example.com/dsv4-operator-fork:1", "args": ["run"]})


def _claim(**spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "w", "namespace": "ns", "uid": "0123456789abcdef", "annotations": {}},
        "spec": {
            "storageClassName": STORAGE_CLASS,
            "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": "174Gi"}},
            **spec,
        },
        "status": {"phase": "Pending"},
    }


def test_the_provisioner_serves_pending_claims_of_its_class_only() -> None:
    assert storage_class()["metadata"]["annotations"] == {
        "storageclass.kubernetes.io/is-default-class": "true"
    }
    assert wants_volume(_claim())
    assert not wants_volume(_claim(storageClassName="other"))
    assert not wants_volume(_claim(volumeName="pv-1"))
    other = _claim()
    other["metadata"]["annotations"]["volume.kubernetes.io/storage-provisioner"] = "x.io/y"
    assert not wants_volume(other)


def test_a_volume_is_made_for_the_claim_with_its_size_modes_and_a_directory(
    tmp_path: Path,
) -> None:
    volume = volume_for_claim(_claim(), tmp_path)
    spec = volume["spec"]
    assert spec["capacity"] == {"storage": "174Gi"} and spec["accessModes"] == ["ReadWriteOnce"]
    assert spec["claimRef"] == {"namespace": "ns", "name": "w", "uid": "0123456789abcdef"}
    assert spec["persistentVolumeReclaimPolicy"] == "Delete"
    assert volume["metadata"]["annotations"]["pv.kubernetes.io/provisioned-by"] == PROVISIONER
    assert Path(spec["hostPath"]["path"]).is_dir()
    assert Path(spec["hostPath"]["path"]).parent == tmp_path
