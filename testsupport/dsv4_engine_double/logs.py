"""The engine double's log lines (SGLang's format, on stderr) and its simulated OOM crash."""

from __future__ import annotations

import os
import signal
import sys
from datetime import datetime
from typing import NoReturn

from dsv4_engine_double.config import DoubleConfig


def log(message: str) -> None:
    """SGLang-style log line on stderr, flushed (the test reads it like a kubelet would)."""
    stamp = datetime.now().strftime("%Y-%m-%d %H:%M:%S")
    sys.stderr.write(f"[{stamp}] {message}\n")
    sys.stderr.flush()


# --- crash ----------------------------------------------------------------------------------

_TRACEBACK = """Traceback (most recent call last):
  File "/sgl-workspace/sglang/python/sglang/srt/managers/scheduler.py", line 3024, in run_scheduler_process
    scheduler.event_loop_normal_disagg_decode()
  File "/sgl-workspace/sglang/python/sglang/srt/managers/scheduler.py", line 1187, in run_batch
    batch_result = self.model_worker.forward_batch_generation(model_worker_batch)
  File "/usr/local/lib/python3.12/dist-packages/torch/utils/_contextlib.py", line 120, in decorate_context
    return func(*args, **kwargs)"""  # noqa: E501


def crash(config: DoubleConfig, where: str) -> NoReturn:
    """Die like SGLang on an OOM: scheduler traceback, SIGQUIT to the parent, kill_process_tree."""
    tp = "TP0" if config.tp_size > 1 else ""
    prefix = f" {tp}" if tp else ""
    log(f"engine double: simulated OOM ({config.oom_kind}) {where}")
    if config.oom_kind == "pool":
        error = (
            "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. "
            f"Current value: mem_fraction_static={config.mem_fraction_static or 0.85}"
        )
    else:
        error = (
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.07 GiB. GPU 0 has a "
            "total capacity of 94.97 GiB of which 612.31 MiB is free. Including non-PyTorch "
            "memory, this process has 94.36 GiB memory in use. Of the allocated memory 90.12 GiB "
            "is allocated by PyTorch, and 2.81 GiB is reserved by PyTorch but unallocated. If "
            "reserved but unallocated memory is large try setting "
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation."
        )
    stamp = datetime.now().strftime("%Y-%m-%d %H:%M:%S")
    sys.stderr.write(f"[{stamp}{prefix}] Scheduler hit an exception: {_TRACEBACK}\n{error}\n\n")
    sys.stderr.write(
        f"[{stamp}] Received sigquit from a child process. It usually means the child failed.\n"
    )
    sys.stderr.flush()
    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGKILL)
    raise SystemExit(137)  # not reached
