"""Runs INSIDE a release's conformance environment: the release's own code judges our output.

Reads a JSON request on stdin and prints a JSON answer; the tests in this folder build the
request from what the operator renders (see test_release.py). Nothing here is a stand-in:
every answer comes from the installed `sglang` / `sglang-router` wheels.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import sys
from typing import Any


def parse_engine(argv: list[str]) -> dict[str, Any]:
    """`prepare_server_args`: the parser of `python -m sglang.launch_server` plus the
    resolution and validation hooks that run without a GPU."""
    import argparse

    from sglang.srt.server_args import ServerArgs, prepare_server_args

    parser = argparse.ArgumentParser(prog="sglang serve")
    ServerArgs.add_cli_args(parser)
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            namespace = parser.parse_args(argv)
    except SystemExit:
        return {"ok": False, "stage": "argparse", "error": stderr.getvalue().strip()[-600:]}
    answer: dict[str, Any] = {"ok": True, "dests": sorted(vars(namespace))}
    try:
        with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
            prepare_server_args(argv)
        answer["validated"] = True
    except SystemExit as error:  # the parser again: cannot happen after parse_args succeeded
        return {"ok": False, "stage": "prepare_server_args", "error": f"exit {error.code}"}
    except Exception as error:  # a hook that needs a GPU or a checkpoint: recorded, not fatal
        answer["validated"] = False
        answer["validationError"] = f"{type(error).__name__}: {error}"[:600]
    return answer


def parse_router(argv: list[str]) -> dict[str, Any]:
    from sglang_router.launch_router import parse_router_args

    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            args = parse_router_args(argv)
    except SystemExit:
        return {"ok": False, "error": stderr.getvalue().strip()[-600:]}
    return {"ok": True, "pdDisaggregation": bool(getattr(args, "pd_disaggregation", False))}


def env_names() -> list[str]:
    from sglang.srt import environ

    return sorted(v.name for v in vars(environ.Envs).values() if isinstance(v, environ.EnvField))


def main() -> None:
    logging.disable(logging.CRITICAL)
    os.environ.setdefault("SGLANG_LOG_LEVEL", "error")
    request = json.load(sys.stdin)
    answer: dict[str, Any] = {
        "engine": {key: parse_engine(argv) for key, argv in request.get("engine", {}).items()},
        "router": {key: parse_router(argv) for key, argv in request.get("router", {}).items()},
    }
    if request.get("env"):
        answer["env"] = env_names()
    if request.get("pools"):
        from pool_check import compute_pools

        answer["pools"] = {key: compute_pools(item) for key, item in request["pools"].items()}
    json.dump(answer, sys.stdout)


if __name__ == "__main__":
    main()
