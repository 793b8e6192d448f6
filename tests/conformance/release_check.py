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


@contextlib.contextmanager
def device_memory(mib: float | None) -> Any:
    """Answer the release's question for the GPU's memory (MiB) with the declared GPU's, where
    it picks settings from it (0.5.16 server_args.py, 0.5.23 arg_groups/memory_hook.py); there
    is no GPU here."""
    if mib is None:
        yield
        return
    import importlib

    patched = []
    for name in ("sglang.srt.server_args", "sglang.srt.arg_groups.memory_hook"):
        try:
            module: Any = importlib.import_module(name)
        except ImportError:
            continue
        if hasattr(module, "get_device_memory_capacity"):
            patched.append((module, module.get_device_memory_capacity))
            module.get_device_memory_capacity = lambda *_: mib
    try:
        yield
    finally:
        for module, saved in patched:
            module.get_device_memory_capacity = saved


def resolved_fields(item: dict[str, Any], model_dir: str) -> dict[str, Any]:
    """The named fields of the server args the release resolves from an argv (what the engine
    runs with, after its own overrides), or the error that stops it."""
    try:
        with (
            contextlib.redirect_stderr(io.StringIO()),
            contextlib.redirect_stdout(io.StringIO()),
            device_memory(item.get("gpuMemMiB")),
        ):
            args = server_args(item["argv"], item.get("modelDir", model_dir), item["gpuArch"])
    except BaseException as error:  # the release refusing the argv
        return {"ok": False, "error": f"{type(error).__name__}: {error}"[:800]}
    try:  # 0.5.23 publishes resolved values on a view; 0.5.16 writes them onto the args
        from sglang.srt.arg_groups.overrides import resolved_view

        view = resolved_view(args)
    except ImportError:
        view = args
    return {"ok": True, **{f: getattr(view, f, getattr(args, f, None)) for f in item["fields"]}}


def parse_router(argv: list[str]) -> dict[str, Any]:
    from sglang_router.launch_router import parse_router_args

    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            args = parse_router_args(argv)
    except SystemExit:
        return {"ok": False, "error": stderr.getvalue().strip()[-600:]}
    return {"ok": True, "pdDisaggregation": bool(getattr(args, "pd_disaggregation", False))}


def _engine_parser() -> Any:
    import argparse

    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser(prog="sglang serve")
    ServerArgs.add_cli_args(parser)
    return parser


def resolve_tokens(tokens: list[str]) -> dict[str, str]:
    """What the engine's parser makes of each `--token` (alone or `--token=value`): the option's
    dest, "unknown" or "ambiguous". `_parse_optional` is argparse's own resolution step (no
    public API exposes it); it exits on an ambiguous prefix."""
    parser = _engine_parser()
    out: dict[str, str] = {}
    for token in tokens:
        try:
            with contextlib.redirect_stderr(io.StringIO()):
                found = parser._parse_optional(token)
        except SystemExit:
            out[token] = "ambiguous"
            continue
        if isinstance(found, list):  # newer Pythons return every candidate
            found = found[0] if len(found) == 1 else None
        action = found[0] if found else None
        out[token] = action.dest if action is not None else "unknown"
    return out


def refused_values(pairs: list[list[str]]) -> list[bool]:
    """Whether the engine's parser refuses the value of each [flag, value]: it exits 2 with
    "argument --flag: invalid choice" (or "invalid int value" where the option converts
    first); the other errors, such as the missing --model-path, are not about the value."""
    parser = _engine_parser()
    out: list[bool] = []
    for pair in pairs:
        stderr = io.StringIO()
        try:
            with contextlib.redirect_stderr(stderr):
                parser.parse_known_args(pair)
        except SystemExit:
            pass
        out.append("error: argument " in stderr.getvalue())
    return out


def source_lines(items: list[dict[str, str]]) -> list[bool]:
    """Whether each {file, text} is in the installed release's source (`file` under the
    `sglang` package)."""
    from pathlib import Path

    import sglang

    root = Path(sglang.__file__).parent
    return [
        (root / item["file"]).is_file() and item["text"] in (root / item["file"]).read_text()
        for item in items
    ]


def handshake_fields() -> list[str]:
    """The fields of the PD bootstrap handshake the decode server reads from a prefill."""
    import dataclasses

    from sglang.srt.disaggregation.common.conn import PrefillServerInfo

    return [f.name for f in dataclasses.fields(PrefillServerInfo)]


def env_names() -> list[str]:
    from sglang.srt import environ

    return sorted(v.name for v in vars(environ.Envs).values() if isinstance(v, environ.EnvField))


def keep_alive() -> float:
    """How long the engine's HTTP server keeps an idle connection by default (seconds)."""
    from sglang.srt.environ import envs

    os.environ.pop("SGLANG_TIMEOUT_KEEP_ALIVE", None)
    seconds: float = envs.SGLANG_TIMEOUT_KEEP_ALIVE.get()
    return seconds


def main() -> None:
    logging.disable(logging.CRITICAL)
    os.environ.setdefault("SGLANG_LOG_LEVEL", "error")
    request = json.load(sys.stdin)
    model_dir = request.get("modelDir", "")
    answer: dict[str, Any] = {
        "engine": {
            key: parse_engine(item["argv"], item.get("modelDir", model_dir), item["gpuArch"])
            for key, item in request.get("engine", {}).items()
        },
        "router": {key: parse_router(argv) for key, argv in request.get("router", {}).items()},
    }
    if request.get("resolved"):
        answer["resolved"] = {
            key: resolved_fields(item, model_dir) for key, item in request["resolved"].items()
        }
    if request.get("env"):
        answer["env"] = env_names()
    if request.get("resolve"):
        answer["resolve"] = resolve_tokens(request["resolve"])
    if request.get("values"):
        answer["values"] = refused_values(request["values"])
    if request.get("sources"):
        answer["sources"] = source_lines(request["sources"])
    if request.get("keepAlive"):
        answer["keepAlive"] = keep_alive()
    if request.get("handshake"):
        answer["handshake"] = handshake_fields()
    if request.get("pools"):
        from pool_check import compute_pools

        answer["pools"] = {key: compute_pools(item) for key, item in request["pools"].items()}
    json.dump(answer, sys.stdout)


if __name__ == "__main__":
    main()
