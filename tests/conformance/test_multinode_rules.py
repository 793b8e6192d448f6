"""Both sides of the multi-node rules, judged by each release's own code: a spec a rule flags
is one the release refuses or mishandles, and the fixed spec is one it runs as the spec says."""

from __future__ import annotations

import copy
import functools
from typing import Any

import pytest
import yaml

from dsv4_operator.api.spec import DSV4DeploymentSpec
from dsv4_operator.engine.effective import effective_role
from dsv4_operator.engine.rules.multinode import release_decode_reserve_mib
from dsv4_operator.engine.validation import validate_spec

from .matrix import EXAMPLES, Case, _rendered
from .release_env import ask, model_dir

pytestmark = pytest.mark.conformance


def _decode_case(version: str, decode: dict[str, Any]) -> tuple[Case, set[str]]:
    """The DSV4-Pro example with `decode` replacing its parallelism, rendered, and its rules."""
    spec = yaml.safe_load((EXAMPLES / "dsv4-pro-pd-h200.yaml").read_text())["spec"]
    spec = copy.deepcopy(spec)
    spec["engine"].update(sglangVersion=version, capabilities=[])
    spec["decode"] = {"replicas": 1, "tensorParallel": 16, **decode}
    validation = validate_spec(spec)
    return _rendered(f"decode-{decode}", spec, validation), {f.rule for f in validation.findings}


# Every question this module asks a release, answered by one call of its code per release
# (each call imports sglang: about ten seconds), keyed by what the tests look up.
ATTENTION_DP: dict[str, dict[str, Any]] = {
    "flagged": {"attentionDataParallel": 3},
    "fixed": {"attentionDataParallel": 16},
}
ALL_TO_ALL: dict[str, dict[str, Any]] = {
    "flagged": {"expertParallel": 2, "moeAllToAll": "deepep"},
    "fixed": {"expertParallel": 16, "moeAllToAll": "deepep"},
}
RESERVES: dict[str, dict[str, Any]] = {
    "NVIDIA-H200": {"attentionDataParallel": 16, "expertParallel": 16, "moeAllToAll": "deepep"},
    "NVIDIA-B200": {},
}
GPU_MIB = {"NVIDIA-H200": 141 * 1024, "NVIDIA-B200": 180 * 1024}


def _item(case: Case, fields: list[str], drop_fraction: bool = False) -> dict[str, Any]:
    argv = case.engine_argv("decode")
    if drop_fraction:
        at = argv.index("--mem-fraction-static")
        del argv[at : at + 2]
    directory = str(model_dir("deepseek-v4-pro"))
    argv[argv.index("--model-path") + 1] = directory
    return {"argv": argv, "gpuArch": "sm90", "modelDir": directory, "fields": fields}


@functools.cache
def _answers(version: str) -> dict[str, dict[str, Any]]:
    """The release's resolution of every decode argv below, asked at once."""
    items: dict[str, dict[str, Any]] = {}
    for side, decode in ATTENTION_DP.items():
        items[f"dp-{side}"] = _item(_decode_case(version, decode)[0], ["tp_size"])
    for side, decode in ALL_TO_ALL.items():
        items[f"a2a-{side}"] = _item(_decode_case(version, decode)[0], ["ep_size"])
    for gpu, decode in RESERVES.items():
        item = _item(_decode_case(version, decode)[0], ["mem_fraction_static"], True)
        items[f"reserve-{gpu}"] = {**item, "gpuMemMiB": GPU_MIB[gpu]}
    answer: dict[str, dict[str, Any]] = ask(version, {"resolved": items})["resolved"]
    return answer


def test_attention_dp_that_does_not_divide_tp_is_refused_by_the_release(version: str) -> None:
    _, rules = _decode_case(version, ATTENTION_DP["flagged"])
    assert "DSV4-R025" in rules
    assert not _answers(version)["dp-flagged"]["ok"]
    _, rules = _decode_case(version, ATTENTION_DP["fixed"])
    assert "DSV4-R025" not in rules
    assert _answers(version)["dp-fixed"] == {"ok": True, "tp_size": 16}


def test_an_ep_spanning_all_to_all_backend_overrides_expert_parallel(version: str) -> None:
    _, rules = _decode_case(version, ALL_TO_ALL["flagged"])
    assert "DSV4-R026" in rules
    # the release runs ep_size 16, not the spec's 2
    assert _answers(version)["a2a-flagged"] == {"ok": True, "ep_size": 16}
    _, rules = _decode_case(version, ALL_TO_ALL["fixed"])
    assert "DSV4-R026" not in rules
    assert _answers(version)["a2a-fixed"] == {"ok": True, "ep_size": 16}


@pytest.mark.parametrize("gpu", sorted(RESERVES))
def test_the_decode_reserve_is_the_fraction_the_release_picks_itself(
    version: str, gpu: str
) -> None:
    # DSV4-R028's bound: without --mem-fraction-static the release keeps exactly this much
    # outside the static pool for the declared GPU (sglang #23769 ran above it)
    case, _ = _decode_case(version, RESERVES[gpu])
    spec = DSV4DeploymentSpec.model_validate({**case.spec, "gpu": {"product": gpu}})
    gpu_mib = GPU_MIB[gpu]
    reserve = release_decode_reserve_mib(effective_role(spec, "decode"), gpu_mib)
    answer = _answers(version)[f"reserve-{gpu}"]
    assert answer == {"ok": True, "mem_fraction_static": round((gpu_mib - reserve) / gpu_mib, 3)}
