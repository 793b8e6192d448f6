"""The release table and its catalogues: every name the operator relies on is a real one."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from dsv4_operator.engine import rules
from dsv4_operator.engine.ownership import OWNED_ENV, OWNED_FLAGS
from dsv4_operator.engine.releases import FORK_ENV, releases, supported_versions
from dsv4_operator.engine.rules import memory

# huggingface_hub variables (where the weights are, no network), not engine variables.
OPERATOR_ONLY_ENV = {"HF_HOME", "HF_HUB_OFFLINE"}


def _all_flags() -> set[str]:
    return {flag for r in releases().values() for flag in r.engine.flags}


def _all_env() -> set[str]:
    return {name for r in releases().values() for name in r.env}


def _named_in_rules(pattern: str) -> set[str]:
    sources = [p.read_text() for p in sorted(Path(rules.__file__).parent.glob("*.py"))]
    return {name for source in sources for name in re.findall(pattern, source)}


def test_supported_releases() -> None:
    assert supported_versions() == ["0.5.23", "0.5.16"]
    for version, release in releases().items():
        assert release.version == version and release.router_version == "0.3.2"
        assert release.engine.allow_abbrev  # argparse's default: prefixes resolve
        assert release.cuda_graph_max_bs_flag["decode"] in release.engine.flags


@pytest.mark.parametrize(
    "flag",
    sorted({*OWNED_FLAGS, *memory._UNMODELLED_FLAGS} | _named_in_rules(r'"(--[a-z0-9-]+)"')),
)
def test_every_flag_the_operator_names_exists_in_a_release(flag: str) -> None:
    assert flag in _all_flags(), f"{flag} is no flag of any supported release (typo?)"


@pytest.mark.parametrize(
    "name",
    sorted(
        ({*OWNED_ENV, *memory._UNMODELLED_ENV} | _named_in_rules(r"(SGLANG_[A-Z0-9_]+)"))
        - OPERATOR_ONLY_ENV
        - set(FORK_ENV)
    ),
)
def test_every_env_name_the_operator_names_exists_in_a_release(name: str) -> None:
    assert name in _all_env(), f"{name} is in no supported release's env registry (typo?)"


def test_fork_env_is_in_no_release() -> None:
    assert not set(FORK_ENV) & _all_env()


def test_prefix_resolution_follows_argparse() -> None:
    parser = releases()["0.5.23"].engine
    assert parser.resolve("--max-total-tok").dests == {"max_total_tokens"}
    assert parser.resolve("--cuda-graph-max-bs").ambiguous
    assert parser.resolve("--no-such-flag").unknown
    assert parser.resolve("--model=x").exact
    assert parser.closest("--enable-mixed-chunks")[0] == "--enable-mixed-chunk"
