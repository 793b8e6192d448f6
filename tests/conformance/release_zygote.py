"""Runs INSIDE a release's conformance environment: imports the release's heavy modules once,
then runs each script it is sent in a forked child, as `python -W ignore script` would run it.

Importing sglang costs about thirteen CPU seconds; a question costs well under one. A child
starts from this process's state just after the imports (nothing else ever runs here), so
one question can never see another's monkeypatches, published runtime context, Prometheus
counts or replaced modules: each child is as fresh as a new interpreter, minus the imports.

Protocol, one JSON object a line: stdin gets {"argv": [script, *args], "cwd", "stdin",
"stdout", "stderr" (file paths), "timeout"}; stdout answers {"returncode"} (negative: the
signal that ended the child; a child past its timeout is killed with SIGKILL).
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import runpy
import signal
import sys
import time
from typing import Any

# What release_check.py, pool_check.py, tool_call_check.py and tools/sglang_catalog.py
# import from the release; a module a release does not have is left to the script.
PRELOAD = (
    "torch",
    "sglang.srt.server_args",
    "sglang.srt.environ",
    "sglang_router.launch_router",
    "sglang_router.router_args",
    "sglang.srt.entrypoints.openai.protocol",
    "sglang.srt.function_call.deepseekv4_detector",
)


def _child(request: dict[str, Any]) -> None:
    """In the forked child: the script's stdio, argv, cwd and sys.path[0], then the script."""
    code = 0
    try:
        for fd, path, flags in (
            (0, request["stdin"], os.O_RDONLY),
            (1, request["stdout"], os.O_WRONLY | os.O_TRUNC),
            (2, request["stderr"], os.O_WRONLY | os.O_TRUNC),
        ):
            opened = os.open(path, flags)
            os.dup2(opened, fd)
            os.close(opened)
        sys.stdin = open(0, encoding="utf-8", closefd=False)  # noqa: SIM115 (the child's stdin)
        script = request["argv"][0]
        os.chdir(request["cwd"])
        sys.argv = list(request["argv"])
        sys.path[0] = os.path.dirname(os.path.abspath(script))
        runpy.run_path(script, run_name="__main__")
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
        if exit_.code is not None and not isinstance(exit_.code, int):
            print(exit_.code, file=sys.stderr)
    except BaseException:  # what the interpreter would print before exiting 1
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):  # a closed stream has nothing to flush
                stream.flush()
        os._exit(code)


def _wait(pid: int, timeout: float) -> int:
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        time.sleep(0.02)


def main() -> None:
    answers = os.fdopen(os.dup(1), "w", encoding="utf-8")
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)  # what the imports print is no answer
    for name in PRELOAD:
        with contextlib.suppress(ImportError):
            importlib.import_module(name)
    answers.write(json.dumps({"ready": True}) + "\n")
    answers.flush()
    for line in sys.stdin:
        request = json.loads(line)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _child(request)
        answers.write(json.dumps({"returncode": _wait(pid, request["timeout"])}) + "\n")
        answers.flush()


if __name__ == "__main__":
    main()
