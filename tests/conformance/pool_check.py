"""Runs INSIDE a release's conformance environment: its own DSV4PoolConfigurator sizes the pools.

The server arguments come from the release's own `prepare_server_args` (and, on releases that
have it, its resolution pipeline via `runtime_context.publish`) applied to the argv the operator
renders, with `--model-path` pointed at tests/conformance/data/deepseek-v4-flash (its
config.json; the engine reads nothing else of the checkpoint for sizing). The only stand-in is
the `kvc` record a model runner would build on a GPU: it carries the same config.json values.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

CUDA = ["--device", "cuda"]  # the engine's view on an NVIDIA node; no GPU is touched


@contextlib.contextmanager
def declared_gpu(arch: str) -> Iterator[None]:
    """Tell the release which GPU the spec targets (`sm90`, `sm100`, `sm120`): there is none.

    0.5.23 has a scoped override for exactly this (`runtime_context.override_platform`);
    0.5.16's hooks call `is_sm100_supported()` from server_args, which is swapped for the call.
    """
    from sglang.srt import server_args as module

    facts = {"is_sm100": arch == "sm100", "is_sm120": arch == "sm120"}
    try:
        from sglang.srt.runtime_context import override_platform
    except ImportError:
        saved = module.is_sm100_supported
        module.is_sm100_supported = lambda *_: facts["is_sm100"]
        try:
            yield
        finally:
            module.is_sm100_supported = saved
        return
    with override_platform(**facts):
        yield


@contextlib.contextmanager
def declared_device(arch: str) -> Iterator[None]:
    """What `select_dsv4_kv_layout` asks torch about the device (0.5.23: the V4.1 layouts exist
    only where `torch.cuda.get_device_capability()[0] == 10`), answered for the declared GPU.
    Scoped to the configurator: nothing else runs while it holds."""
    import torch

    major = int(arch.removeprefix("sm")) // 10
    saved = torch.cuda.is_available, torch.cuda.get_device_capability
    torch.cuda.is_available = lambda: True
    torch.cuda.get_device_capability = lambda *_: (major, 0)
    try:
        yield
    finally:
        torch.cuda.is_available, torch.cuda.get_device_capability = saved


def pd_kv_layout(compress_ratios: list[int]) -> str | None:
    """The release's own `pd_kv_layout` string for the layouts it selects now (None where the
    release has one layout only), built from its `select_dsv4_kv_layout` and
    `resolve_compressed_kv_layout` as `DeepSeekV4TokenToKVPool.pd_kv_layout` does."""
    try:
        from sglang.srt.mem_cache.deepseek_v4_memory_pool import (
            resolve_compressed_kv_layout,
            select_dsv4_kv_layout,
        )
    except ImportError:
        return None
    from sglang.kernels.ops.attention.dsv4.kv_layout import KVLayout
    from sglang.srt.runtime_context import get_exec

    if get_exec().kernel.dsv4_attn_backend == "trtllm":
        return str(KVLayout.UNIFORM_FP8.value)
    layout, option = select_dsv4_kv_layout()
    compressed = [
        f"c{ratio}:{resolve_compressed_kv_layout(layout, ratio, option).value}"
        for ratio in sorted(set(compress_ratios) - {0})
    ]
    return ",".join([layout.value, *compressed])


def server_args(argv: list[str], model_dir: str, gpu_arch: str) -> Any:
    """The release's own server args for an operator-rendered argv, hooks resolved."""
    from sglang.srt.server_args import prepare_server_args

    argv = list(argv)
    argv[argv.index("--model-path") + 1] = model_dir
    with declared_gpu(gpu_arch):
        args = prepare_server_args(argv + CUDA)
        try:  # 0.5.23: resolve the hooks and publish the config bags the configurator reads
            from sglang.srt.runtime_context import publish
        except ImportError:
            return args
        publish(args, role="test")
    return args


def _kvc(args: Any, config: dict[str, Any]) -> SimpleNamespace:
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    layers = config["num_hidden_layers"]
    model_config = SimpleNamespace(
        qk_nope_head_dim=config["qk_nope_head_dim"],
        qk_rope_head_dim=config["qk_rope_head_dim"],
        index_head_dim=config["index_head_dim"],
        context_len=args.context_length,
        compress_ratios=config["compress_ratios"],
        window_size=config["window_size"],
        hf_config=SimpleNamespace(kv_source_layer_ids=config.get("kv_source_layer_ids", [])),
    )
    # Attention-DP groups as the release resolves them: 0.5.23 turns the deprecated
    # `--dp-size N --enable-dp-attention` (and its own --attn-dp-size) into attn_dp_size.
    dp = getattr(args, "attn_dp_size", 1) or 1
    if dp == 1 and getattr(args, "enable_dp_attention", False):
        dp = args.dp_size
    return SimpleNamespace(
        server_args=args,
        kv_cache_dtype_str=args.kv_cache_dtype,
        model_config=model_config,
        layer_info=SimpleNamespace(start_layer=0, end_layer=layers),
        pp_size=1,
        pp_group=None,
        ps=SimpleNamespace(pp_size=1, attn_dp_size=dp),
        attn_dp_size=dp,
        sliding_window_size=config["sliding_window"],
        page_size=args.page_size or 256,
        spec_algorithm=SpeculativeAlgorithm.from_string(args.speculative_algorithm),
        spec_aux_config=SimpleNamespace(),
        is_draft_worker=False,
    )


def _configurator_class(patched_source: str | None) -> Any:
    """The release's DSV4PoolConfigurator, or the one of a patched copy of its module."""
    if patched_source is None:
        from sglang.srt.model_executor.pool_configurator import DSV4PoolConfigurator

        return DSV4PoolConfigurator
    name = "sglang.srt.model_executor.pool_configurator"
    spec = importlib.util.spec_from_file_location(name, patched_source)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module.DSV4PoolConfigurator


def compute_pools(item: dict[str, Any]) -> dict[str, Any]:
    """Pool sizes for one role: {bytesPerFullToken, full, swa, c4, c128, c4State} or error."""
    env = item.get("env", {})
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        model_dir = item["modelDir"]
        config = json.loads((Path(model_dir) / "config.json").read_text())
        args = server_args(item["argv"], model_dir, item["gpuArch"])
        with declared_device(item["gpuArch"]):
            configurator = _configurator_class(item.get("patchedSource"))(_kvc(args, config))
            sizes = configurator.calculate_pool_sizes(item["availableBytes"], args.page_size or 256)
            layout = pd_kv_layout(config["compress_ratios"])
        answer = {
            "ok": True,
            "bytesPerFullToken": configurator.bytes_per_full_token,
            "full": sizes.full_max_total_num_tokens,
            "swa": sizes.swa_max_total_num_tokens,
            "c4": sizes.c4_max_total_num_tokens,
            "c128": sizes.c128_max_total_num_tokens,
            "c4State": sizes.c4_state_pool_size,
        }
        if item.get("kvLayout"):
            answer["kvLayout"] = layout
        return answer
    except Exception as error:  # reported to the test, which fails on it
        return {"ok": False, "error": f"{type(error).__name__}: {error}"[:800]}
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
