"""Both sides of the multi-node rules, judged by each release's own code: a spec a rule flags
is one the release refuses or mishandles, and the fixed spec is one it runs as the spec says."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
import yaml

from dsv4_operator.api.spec import DSV4DeploymentSpec
from dsv4_operator.engine.effective import effective_role
from dsv4_operator.engine.rules.multinode import release_decode_reserve_mib
from dsv4_operator.engine.validation import validate_spec

from .matrix import EXAMPLES, Case, _rendered
from .release_env import model_dir

pytestmark = pytest.mark.conformance

Ask = Callable[[str, dict[str, Any]], dict[str, Any]]


def _decode_case(version: str, decode: dict[str, Any]) -> tuple[Case, set[str]]:
    """The DSV4-Pro example with `decode` replacing its parallelism, rendered, and its rules."""
    spec = yaml.safe_load((EXAMPLES / "dsv4-pro-pd-h200.yaml").read_text())["spec"]
    spec = copy.deepcopy(spec)
    spec["engine"].update(sglangVersion=version, capabilities=[])
    spec["decode"] = {"replicas": 1, "tensorParallel": 16, **decode}
    validation = validate_spec(spec)
    return _rendered(f"decode-{decode}", spec, validation), {f.rule for f in validation.findings}


def _resolve(version: str, asker: Ask, case: Case, fields: list[str]) -> dict[str, Any]:
    argv = case.engine_argv("decode")
    directory = str(model_dir("deepseek-v4-pro"))
    argv[argv.index("--model-path") + 1] = directory
    request = {"resolved": {"d": {"argv": argv, "gpuArch": "sm90", "modelDir": directory}}}
    request["resolved"]["d"]["fields"] = fields
    answer: dict[str, Any] = asker(version, request)["resolved"]["d"]
    return answer


def test_attention_dp_that_does_not_divide_tp_is_refused_by_the_release(
    version: str, asker: Ask
) -> None:
    flagged, rules = _decode_case(version, {"attentionDataParallel": 3})
    assert "DSV4-R025" in rules
    assert not _resolve(version, asker, flagged, ["tp_size"])["ok"]
    fixed, rules = _decode_case(version, {"attentionDataParallel": 16})
    assert "DSV4-R025" not in rules
    assert _resolve(version, asker, fixed, ["tp_size"]) == {"ok": True, "tp_size": 16}


def test_an_ep_spanning_all_to_all_backend_overrides_expert_parallel(
    version: str, asker: Ask
) -> None:
    flagged, rules = _decode_case(version, {"expertParallel": 2, "moeAllToAll": "deepep"})
    assert "DSV4-R026" in rules
    # the release runs ep_size 16, not the spec's 2
    assert _resolve(version, asker, flagged, ["ep_size"]) == {"ok": True, "ep_size": 16}
    fixed, rules = _decode_case(version, {"expertParallel": 16, "moeAllToAll": "deepep"})
    assert "DSV4-R026" not in rules
    assert _resolve(version, asker, fixed, ["ep_size"]) == {"ok": True, "ep_size": 16}


@pytest.mark.parametrize(
    ("gpu", "decode"),
    [
        (
            "NVIDIA-H200",
            {"attentionDataParallel": 16, "expertParallel": 16, "moeAllToAll": "deepep"},
        ),
        ("NVIDIA-B200", {}),
    ],
)
def test_the_decode_reserve_is_the_fraction_the_release_picks_itself(
    version: str, asker: Ask, gpu: str, decode: dict[str, Any]
) -> None:
    # DSV4-R028's bound: without --mem-fraction-static the release keeps exactly this much
    # outside the static pool for the declared GPU (sglang #23769 ran above it)
    case, _ = _decode_case(version, decode)
    spec = DSV4DeploymentSpec.model_validate({**case.spec, "gpu": {"product": gpu}})
    gpu_mib = {"NVIDIA-H200": 141, "NVIDIA-B200": 180}[gpu] * 1024
    reserve = release_decode_reserve_mib(effective_role(spec, "decode"), gpu_mib)
    argv = case.engine_argv("decode")
    at = argv.index("--mem-fraction-static")
    del argv[at : at + 2]
    directory = str(model_dir("deepseek-v4-pro"))
    argv[argv.index("--model-path") + 1] = directory
    item = {"argv": argv, "gpuArch": "sm90", "modelDir": directory, "gpuMemMiB": gpu_mib}
    item["fields"] = ["mem_fraction_static"]
    answer = asker(version, {"resolved": {"d": item}})["resolved"]["d"]
    assert answer == {"ok": True, "mem_fraction_static": round((gpu_mib - reserve) / gpu_mib, 3)}
