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

from pool_check import server_args  # same folder: sys.path[0] is this script's


def parse_engine(argv: list[str], model_dir: str, gpu_arch: str) -> dict[str, Any]:
    """The parser of `python -m sglang.launch_server`, then `prepare_server_args` and (0.5.23)
    the resolution pipeline with the model's config.json: the hooks that refuse a bad
    combination at start-up, as far as they run without a GPU."""
    import argparse

    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser(prog="sglang serve")
    ServerArgs.add_cli_args(parser)
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            parser.parse_args(argv)
    except SystemExit:
        errors = [line for line in stderr.getvalue().splitlines() if "error:" in line]
        return {"ok": False, "stage": "argparse", "error": (errors or ["exit 2"])[-1][-600:]}
    try:
        with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
            server_args(argv, model_dir, gpu_arch)
    except BaseException as error:  # an assert or ValueError of a hook is the engine refusing
        message = f"{type(error).__name__}: {error}"[:800]
        return {"ok": False, "stage": "resolution", "error": message}
    return {"ok": True}


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
    model_dir = request.get("modelDir", "")
    answer: dict[str, Any] = {
        "engine": {
            key: parse_engine(item["argv"], model_dir, item["gpuArch"])
            for key, item in request.get("engine", {}).items()
        },
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
