"""Print one SGLang release's parser options, env registry and router options as JSON.

Runs inside that release's conformance environment (tools/conformance_env.py), where the
`sglang` and `sglang-router` wheels import on CPU:

    $(python3 tools/conformance_env.py 0.5.23) tools/sglang_catalog.py \
        > operator/dsv4_operator/engine/data/sglang/0.5.23.json

The operator reads the result as data (engine/releases.py); tests/conformance regenerates it
and fails when the committed file differs from what the release's own code says.
"""

from __future__ import annotations

import argparse
import json
import sys
from importlib import metadata
from typing import Any


def _options(parser: argparse.ArgumentParser) -> list[dict[str, Any]]:
    options = []
    for action in parser._actions:  # argparse has no public iterator over its actions
        if not action.option_strings:
            continue
        choices = action.choices
        options.append(
            {
                "flags": sorted(action.option_strings),
                "dest": action.dest,
                "takesValue": action.nargs != 0,
                "choices": sorted(str(c) for c in choices) if choices is not None else None,
            }
        )
    return sorted(options, key=lambda o: (o["dest"], o["flags"]))


def engine_parser() -> argparse.ArgumentParser:
    """The parser `python -m sglang.launch_server` builds (server_args.prepare_server_args)."""
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser(prog="sglang serve")
    ServerArgs.add_cli_args(parser)
    return parser


def router_parser() -> argparse.ArgumentParser:
    """The parser `python -m sglang_router.launch_router` builds (parse_router_args)."""
    from sglang_router.router_args import RouterArgs

    parser = argparse.ArgumentParser(prog="sglang_router.launch_router")
    RouterArgs.add_cli_args(parser, use_router_prefix=False)
    return parser


def env_names() -> list[str]:
    """Every variable of `sglang.srt.environ.Envs`, deprecated aliases included."""
    from sglang.srt import environ

    names: set[str] = set()
    for value in vars(environ.Envs).values():
        if isinstance(value, environ.EnvField):
            names.add(value.name)
            alias = getattr(value, "deprecated_name", None)  # EnvBoolWithAlias and kin
            if isinstance(alias, str):
                names.add(alias)
    return sorted(names)


def catalog() -> dict[str, Any]:
    engine, router = engine_parser(), router_parser()
    return {
        "sglang": metadata.version("sglang"),
        "sglangRouter": metadata.version("sglang-router"),
        "engine": {"allowAbbrev": engine.allow_abbrev, "options": _options(engine)},
        "router": {"allowAbbrev": router.allow_abbrev, "options": _options(router)},
        "env": env_names(),
    }


if __name__ == "__main__":
    json.dump(catalog(), sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")
