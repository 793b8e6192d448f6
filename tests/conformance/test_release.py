"""Every command, env var and memory plan the operator renders, judged by the real releases.

For each supported SGLang release (its `sglang` and `sglang-router` wheels, CPU-only): the
committed flag/env catalogue equals what the release's own code declares; every engine argv of
the examples and of a generated matrix parses and resolves with the release's `ServerArgs`;
every router argv parses with `sglang_router`; every env name exists in `envs`; and the
planner's bytes per full token and pool sizes equal the release's `DSV4PoolConfigurator` to the
byte.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from dsv4_operator.api.roles import ROLES
from dsv4_operator.engine.releases import FORK_ENV

from .matrix import MULTINODE_PREFIX, Case, cases
from .release_env import MODEL_DIR, REPO, model_dir, run_in_release

pytestmark = pytest.mark.conformance

Ask = Callable[[str, dict[str, Any]], dict[str, Any]]
# huggingface_hub variables, not engine ones: where the weights cache is mounted, and that the
# engines read it offline (spec.model.cache.huggingFace).
OPERATOR_ENV = {"HF_HOME", "HF_HUB_OFFLINE"}


def _model_dir(case: Case) -> str:
    return str(model_dir(case.plan.profiles.model.key))


def _with_model_dir(argv: list[str], directory: str) -> list[str]:
    argv = list(argv)
    argv[argv.index("--model-path") + 1] = directory
    return argv


def _arch(case: Case) -> str:
    gpu = case.plan.profiles.gpu
    assert gpu is not None, case.id
    return gpu.compute_capability


def test_catalogue_is_what_the_release_declares(version: str) -> None:
    committed = json.loads(
        (REPO / "operator/dsv4_operator/engine/data/sglang" / f"{version}.json").read_text()
    )
    generated = json.loads(run_in_release(version, REPO / "tools" / "sglang_catalog.py"))
    assert generated["sglang"] == version
    assert generated == committed, (
        f"regenerate: $(python3 tools/conformance_env.py {version}) tools/sglang_catalog.py "
        f"> operator/dsv4_operator/engine/data/sglang/{version}.json"
    )


@pytest.fixture(scope="module")
def all_cases() -> dict[str, list[Case]]:
    from .release_env import RELEASES

    return {version: cases(version) for version in RELEASES}


def test_matrix_covers_every_combination(all_cases: dict[str, list[Case]], version: str) -> None:
    # 3 index-K x 2 HiCache x 2 overlap x 4 TP x 2 speculative, all valid, plus the examples
    generated = [
        c for c in all_cases[version] if not c.id.startswith(("examples/", MULTINODE_PREFIX))
    ]
    assert len(generated) == 96
    # DeepSeek-V4-Pro across 2 nodes: 2 GPUs x 3 parallel layouts, all valid
    assert len([c for c in all_cases[version] if c.id.startswith(MULTINODE_PREFIX)]) == 6
    assert any(c.id.startswith("examples/") for c in all_cases[version])


def test_every_engine_and_router_command_parses(
    all_cases: dict[str, list[Case]], version: str, asker: Ask
) -> None:
    request = {
        "modelDir": str(MODEL_DIR),
        "engine": {
            f"{c.id}/{r}": {
                "argv": c.engine_argv(r),
                "gpuArch": _arch(c),
                "modelDir": _model_dir(c),
            }
            for c in all_cases[version]
            for r in ROLES
        },
        "router": {c.id: c.router_argv() for c in all_cases[version]},
        "env": True,
    }
    answer = asker(version, request)
    refused = {k: v for k, v in answer["engine"].items() if not v["ok"]}
    assert not refused, f"sglang {version} refuses {len(refused)} commands: {refused}"
    assert all(v["ok"] and v["pdDisaggregation"] for v in answer["router"].values()), answer[
        "router"
    ]
    declared = set(answer["env"])
    for case in all_cases[version]:
        for role in ROLES:
            for name, _ in case.launches[role].env:
                fork_only = name in FORK_ENV
                assert name in declared or name in OPERATOR_ENV or fork_only, (case.id, name)
                if fork_only:
                    assert name not in declared, f"{name} became upstream: retire FORK_ENV"


def test_multi_node_argv_parses_on_every_node_of_a_group(
    all_cases: dict[str, list[Case]], version: str, asker: Ask
) -> None:
    # what each pod of a LeaderWorkerSet group adds: its rank and the leader's rendezvous
    wiring = ["--node-rank", "1", "--dist-init-addr", "dsv4-pro-decode-0.dsv4-pro:20000"]
    multinode = [c for c in all_cases[version] if c.id.startswith(MULTINODE_PREFIX)]
    request = {
        "engine": {
            f"{c.id}/{r}": {
                "argv": [*c.engine_argv(r), *wiring],
                "gpuArch": _arch(c),
                "modelDir": _model_dir(c),
            }
            for c in multinode
            for r in ROLES
        }
    }
    assert all("--nnodes" in c.engine_argv(r) for c in multinode for r in ROLES)
    answer = asker(version, request)["engine"]
    refused = {k: v for k, v in answer.items() if not v["ok"]}
    assert len(answer) == 2 * len(multinode) and not refused, refused


def test_planner_equals_the_release_configurator_to_the_byte(
    all_cases: dict[str, list[Case]], version: str, asker: Ask
) -> None:
    request: dict[str, Any] = {"pools": {}}
    expected: dict[str, dict[str, Any]] = {}
    for case in all_cases[version]:
        for role in ROLES:
            plan = case.plan.roles[role]
            engine = plan.engine_sizing  # what an unpatched configurator reserves
            full = engine.full_tokens(plan.available_bytes, 256)
            swa = engine.swa_tokens(full, 256)
            ring = 16 if "--speculative-algorithm" in case.engine_argv(role) else 8
            # 0.5.16 addresses the C4 state ring per 128-token window, 0.5.23 per storage page
            state_page = (
                128 if case.plan.profiles.release.pool_arithmetic.value == "dsv4-ratio" else 256
            )
            key = f"{case.id}/{role}"
            request["pools"][key] = {
                "argv": _with_model_dir(case.engine_argv(role), _model_dir(case)),
                "env": dict(case.launches[role].env),
                "modelDir": _model_dir(case),
                "availableBytes": plan.available_bytes,
                "gpuArch": _arch(case),
            }
            expected[key] = {
                "ok": True,
                "bytesPerFullToken": engine.bytes_per_full_token,
                "full": full,
                "swa": swa,
                "c4": full // 4,
                "c128": full // 128,
                "c4State": swa // state_page * ring,
            }
    answer = asker(version, request)["pools"]
    differences = {k: (answer[k], v) for k, v in expected.items() if answer[k] != v}
    assert not differences, f"{len(differences)} of {len(expected)} differ: {differences}"
