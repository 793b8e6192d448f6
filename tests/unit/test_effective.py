"""Passthrough parsing and the merge of spec.engine with a role's overrides."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dsv4_operator.api.spec import DSV4DeploymentSpec
from dsv4_operator.engine.effective import effective_role, parse_args


def test_parse_args_forms_and_aliases() -> None:
    flags = parse_args(["--tp", "8", "--page_size=128", "--enable-dp-attention", "--dp", "2"])
    assert flags["--tp-size"] == (0, "8")
    assert flags["--page-size"] == (2, "128")
    assert flags["--enable-dp-attention"] == (3, None)
    assert flags["--dp-size"] == (4, "2")


def test_role_overrides_win(variant: Callable[..., dict[str, Any]]) -> None:
    spec = DSV4DeploymentSpec.model_validate(
        variant(
            {
                "engine.env": [{"name": "A", "value": "1"}, {"name": "B", "value": "1"}],
                "engine.extraArgs": ["--trust-remote-code"],
                "decode.overrides": {
                    "maxRunningRequests": 32,
                    "overlap": {"scheduler": True},
                    "env": [{"name": "B", "value": "2"}],
                    "extraArgs": ["--enable-dp-attention"],
                },
            }
        )
    )
    decode, prefill = effective_role(spec, "decode"), effective_role(spec, "prefill")
    assert decode.max_running_requests == 32 and prefill.max_running_requests == 64
    assert decode.overlap_scheduler and not prefill.overlap_scheduler
    assert decode.env_map == {"A": "1", "B": "2"} and prefill.env_map == {"A": "1", "B": "1"}
    assert set(decode.flags) == {"--trust-remote-code", "--enable-dp-attention"}
    assert set(prefill.flags) == {"--trust-remote-code"}
