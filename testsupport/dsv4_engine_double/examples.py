"""The engine double as the operator renders it for the example spec, and sample canary-like
conversations: shared by the double's in-process tests and the ones that start it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from dsv4_engine_double.config import DoubleConfig
from dsv4_engine_double.process import launch_from_statefulset
from dsv4_engine_double.server import answer, conversation_rng
from dsv4_operator.api.spec import DSV4DeploymentSpec
from dsv4_operator.canary.scenario import CANARY_TOOLS
from dsv4_operator.render.children import render_spec

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "dsv4.yaml"
Doc = dict[str, Any]
BF16_HICACHE = {
    "engine.indexKDtype": "bf16",
    "engine.hicache": {"enabled": True, "ratio": 2.0},
}
# HiCache is rendered on the prefill role (PD decode disables the radix cache it extends), so
# the HiCache tests run the prefill engine's argv.
ROLE = "prefill"


def rendered(changes: dict[str, Any], role: str = ROLE) -> tuple[list[str], dict[str, str]]:
    """Argv and env of the example's engine StatefulSet for `role`, with `changes` (dotted
    paths of the spec) applied."""
    spec = yaml.safe_load(EXAMPLE.read_text())["spec"]
    for dotted, value in changes.items():
        *parents, last = dotted.split(".")
        node = spec
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    model = DSV4DeploymentSpec.model_validate(spec)
    manifests = render_spec("dsv4-flash", "default", model)
    sts = next(
        m
        for m in manifests
        if m["kind"] == "StatefulSet" and m["metadata"]["name"] == f"dsv4-flash-{role}"
    )
    return launch_from_statefulset(sts, [c.value for c in model.engine.capabilities])


def conversation(i: int) -> Doc:
    """The i-th one-turn tool-calling request (the same text for the same i)."""
    return {
        "model": "deepseek-v4-flash",
        "messages": [{"role": "user", "content": f"Conversation {i}: weather in Oslo, then docs."}],
        "tools": CANARY_TOOLS,
    }


def corrupted(config: DoubleConfig, body: Doc, load: int) -> bool:
    """Whether the double, so configured, answers `body` with a leak at a declared `load`."""
    return answer(config, body, conversation_rng(config.seed, body), load, 10).shape is not None
