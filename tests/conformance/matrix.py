"""The specs the conformance tier renders: every example plus a generated matrix per release."""

from __future__ import annotations

import copy
import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from dsv4_operator.api.roles import ROLES, Role
from dsv4_operator.engine.flags import Launch, engine_launch, router_launch, served_name
from dsv4_operator.engine.planner import MemoryPlan
from dsv4_operator.engine.validation import Validation, validate_spec

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
ENGINE_ENTRYPOINT_LEN = 3  # python3 -m sglang.launch_server
ROUTER_ENTRYPOINT_LEN = 3  # python3 -m sglang_router.launch_router
# DeepSeek-V4 runs EAGLE only with topk 1 and explicit steps/draft tokens (DSV4-R021).
EAGLE = [
    "--speculative-algorithm", "EAGLE", "--speculative-eagle-topk", "1",
    "--speculative-num-steps", "3", "--speculative-num-draft-tokens", "4",
]  # fmt: skip


@dataclass(frozen=True)
class Case:
    """One spec of the matrix, validated and planned, with what the operator renders for it."""

    id: str
    spec: dict[str, Any]
    plan: MemoryPlan
    launches: dict[Role, Launch]
    router: Launch

    def engine_argv(self, role: Role) -> list[str]:
        return list(self.launches[role].command[ENGINE_ENTRYPOINT_LEN:])

    def router_argv(self) -> list[str]:
        return list(self.router.command[ROUTER_ENTRYPOINT_LEN:])


def _set(doc: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, last = dotted.split(".")
    for part in parents:
        doc = doc.setdefault(part, {})
    doc[last] = value


def _example_specs() -> Iterator[tuple[str, dict[str, Any]]]:
    for path in sorted(EXAMPLES.rglob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if isinstance(doc, dict) and doc.get("kind") == "DSV4Deployment":
                yield path.relative_to(REPO).as_posix(), doc["spec"]


def generated_specs(version: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """index-K x HiCache x overlap x TP x speculative, on the example, for one release.

    Weights are set small so every TP fits one GPU; safety Warn keeps acknowledgeable findings
    from blocking the render (what is compared here is the engine's view, not the policy).
    """
    base = yaml.safe_load((EXAMPLES / "dsv4.yaml").read_text())["spec"]
    for index_k, hicache, overlap, tp, speculative in itertools.product(
        ("fp8", "bf16", "fp4"), (False, True), (False, True), (1, 2, 4, 8), (False, True)
    ):
        spec = copy.deepcopy(base)
        _set(spec, "engine.sglangVersion", version)
        _set(spec, "engine.indexKDtype", index_k)
        # the unpatched wheels are compared, so no poolSizingFix (test_patches covers the fix)
        capabilities = ["bf16IndexK"] if index_k == "bf16" else []
        _set(spec, "engine.capabilities", capabilities)
        _set(spec, "engine.hicache", {"enabled": hicache})
        _set(spec, "engine.overlap", {"scheduler": overlap, "multiStream": False})
        _set(spec, "model.weightsGiB", 40)
        _set(spec, "gpu.product", "NVIDIA-B200")
        for role in ROLES:
            _set(spec, f"{role}.tensorParallel", tp)
        if speculative:
            _set(spec, "engine.extraArgs", EAGLE)
        _set(spec, "safety.policy", "Warn")
        name = (
            f"{index_k}-hicache{int(hicache)}-overlap{int(overlap)}-tp{tp}-spec{int(speculative)}"
        )
        yield name, spec


MULTINODE_PREFIX = "multinode/"
# Parallel layouts of a DeepSeek-V4-Pro role across 2 nodes x 8 GPUs.
MULTINODE_LAYOUTS: dict[str, dict[str, Any]] = {
    "tp16": {"tensorParallel": 16},
    "tp16-ep16-deepep": {"tensorParallel": 16, "expertParallel": 16, "moeAllToAll": "deepep"},
    "tp16-dp16-ep16-deepep": {
        "tensorParallel": 16,
        "attentionDataParallel": 16,
        "expertParallel": 16,
        "moeAllToAll": "deepep",
    },
}


def multinode_specs(version: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """examples/dsv4-pro-pd-h200.yaml on H200 and B200 with each layout on both roles, for one
    release (unpatched: no capabilities; safety Warn as in generated_specs)."""
    base = yaml.safe_load((EXAMPLES / "dsv4-pro-pd-h200.yaml").read_text())["spec"]
    for gpu, (layout, parallel) in itertools.product(
        ("NVIDIA-H200", "NVIDIA-B200"), MULTINODE_LAYOUTS.items()
    ):
        spec = copy.deepcopy(base)
        _set(spec, "engine.sglangVersion", version)
        _set(spec, "engine.capabilities", [])
        _set(spec, "gpu.product", gpu)
        for role in ROLES:
            overrides = spec[role].get("overrides", {})
            spec[role] = {"replicas": 1, **parallel, "overrides": overrides}
        _set(spec, "safety.policy", "Warn")
        yield f"{MULTINODE_PREFIX}{gpu}-{layout}", spec


def cases(version: str) -> list[Case]:
    """Every valid spec of the matrix and the examples for `version`, rendered (invalid ones
    are skipped here: the unit tests cover refusals)."""
    sources = list(generated_specs(version)) + list(multinode_specs(version))
    sources += [
        (name, spec)
        for name, spec in _example_specs()
        if spec.get("engine", {}).get("sglangVersion") == version
    ]
    return cases_from(sources)


def cases_from(sources: list[tuple[str, dict[str, Any]]]) -> list[Case]:
    """Validate, plan and render each (name, spec); invalid specs are left out."""
    out: list[Case] = []
    for name, spec in sources:
        validation = validate_spec(spec)
        if validation.valid:
            out.append(_rendered(name, spec, validation))
    return out


def _rendered(name: str, spec: dict[str, Any], validation: Validation) -> Case:
    """What the operator would render for a spec (the validator refuses invalid ones: this is
    for showing that the release refuses them too)."""
    assert validation.spec is not None and validation.plan is not None, name
    parsed, plan = validation.spec, validation.plan
    served = served_name(parsed, plan.profiles.model.served_name)
    launches = {role: engine_launch(parsed, plan, role, served) for role in ROLES}
    router = router_launch(parsed, ["http://p-0.p.ns.svc:30000"], ["http://d-0.d.ns.svc:30000"])
    return Case(name, spec, plan, launches, router)


KV_LAYOUTS = (None, "v4", "auto", "v41", "v41_new", "v5")
COMPRESSED_KV_LAYOUTS = (None, "fp8", "fp4")
LAYOUT_GPUS = ("NVIDIA-B200", "NVIDIA-H200")


def layout_cases(version: str) -> list[tuple[Case, list[str]]]:
    """SGLANG_DSV4_KV_LAYOUT x SGLANG_DSV4_COMPRESSED_KV_LAYOUT x an SM100 and an SM90 GPU on
    the example, rendered, each with the rules that refuse it (DSV4-R024 where the release
    would not start)."""
    base = yaml.safe_load((EXAMPLES / "dsv4.yaml").read_text())["spec"]
    out: list[tuple[Case, list[str]]] = []
    for gpu, main, compressed in itertools.product(LAYOUT_GPUS, KV_LAYOUTS, COMPRESSED_KV_LAYOUTS):
        spec = copy.deepcopy(base)
        _set(spec, "engine.sglangVersion", version)
        _set(spec, "engine.capabilities", [])
        _set(spec, "model.weightsGiB", 40)
        _set(spec, "gpu.product", gpu)
        env = [{"name": "SGLANG_DSV4_KV_LAYOUT", "value": main}] if main else []
        if compressed:
            env.append({"name": "SGLANG_DSV4_COMPRESSED_KV_LAYOUT", "value": compressed})
        _set(spec, "engine.env", env)
        validation = validate_spec(spec)
        name = f"layout-{gpu}-{main or 'unset'}-{compressed or 'unset'}"
        out.append((_rendered(name, spec, validation), validation.rule_ids()))
    return out
