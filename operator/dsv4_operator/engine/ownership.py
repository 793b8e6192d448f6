"""Which sglang flags and env names the operator owns (the settings both roles share are each
release's `pairing`, engine/data/releases.yaml)."""

from __future__ import annotations

_MULTI_NODE = (
    "nothing: the operator sets it when a replica spans nodes "
    "(spec.<role>.tensorParallel above spec.gpu.perNode)"
)
_OVERRIDABLE = "spec.engine.{field} (or spec.<role>.overrides.{field})"

# Flag -> the spec field to use instead. Keyed by the canonical spelling (`--` + the parser's
# destination with dashes): passthrough tokens are resolved through the release's own parser
# first (aliases, `=` forms, unambiguous prefixes), so every spelling lands on these keys.
OWNED_FLAGS: dict[str, str] = {
    "--model-path": "spec.model.name",
    "--served-model-name": "spec.model.servedName",
    "--tp-size": "spec.<role>.tensorParallel",
    "--pp-size": "not supported: a replica spans nodes by tensor parallelism "
    "(spec.<role>.tensorParallel)",
    "--nnodes": _MULTI_NODE,
    "--node-rank": _MULTI_NODE,
    "--dist-init-addr": _MULTI_NODE,
    "--host": "nothing: the operator binds 0.0.0.0",
    "--port": "nothing: the engine port is fixed at 30000",
    "--disaggregation-mode": "nothing: the role sets it",
    "--disaggregation-bootstrap-port": "spec.transfer.bootstrapPort",
    "--disaggregation-transfer-backend": "spec.transfer.backend",
    "--disaggregation-ib-device": "spec.transfer.ibDevices",
    "--disaggregation-enable-kv-checksum": "spec.transfer.kvChecksum",
    "--kv-cache-dtype": "spec.engine.kvCacheDtype",
    # An input of the pool arithmetic: DeepSeek-V4 runs the page size its release sets (256 on
    # CUDA), which is what the planner plans with; no spelling of it may reach the engine.
    "--page-size": "nothing: the release sets the model's page size and the planner plans "
    "with it (see `dsv4 plan`)",
    "--enable-deepseek-v4-fp4-indexer": "spec.engine.indexKDtype (fp4)",
    "--enable-hierarchical-cache": "spec.engine.hicache.enabled",
    "--hicache-ratio": "spec.engine.hicache.ratio",
    "--hicache-size": "spec.engine.hicache.sizeGB",
    "--hicache-write-policy": "spec.engine.hicache.writePolicy",
    "--disable-overlap-schedule": _OVERRIDABLE.format(field="overlap.scheduler"),
    "--cuda-graph-max-bs": _OVERRIDABLE.format(field="cudaGraphMaxBs"),
    "--cuda-graph-max-bs-decode": _OVERRIDABLE.format(field="cudaGraphMaxBs"),
    "--cuda-graph-config": _OVERRIDABLE.format(field="cudaGraphMaxBs")
    + " (its JSON would override the rendered graph size)",
    "--swa-full-tokens-ratio": "nothing: the planner sizes the SWA pool (see `dsv4 plan`)",
    "--disaggregation-decode-extra-slots": "nothing: the planner sizes the request slots",
    "--max-running-requests": _OVERRIDABLE.format(field="maxRunningRequests"),
    "--mem-fraction-static": _OVERRIDABLE.format(field="memFractionStatic"),
    "--context-length": "spec.engine.contextLength",
    "--max-total-tokens": "nothing: the planner computes it (see `dsv4 plan`)",
    "--tool-call-parser": "spec.engine.toolCallParser",
    "--reasoning-parser": "spec.engine.reasoningParser",
    "--enable-metrics": "nothing: the operator always enables metrics",
    "--revision": "spec.model.cache.huggingFace.revision",
}

# Env name -> the spec field to use instead.
OWNED_ENV: dict[str, str] = {
    "SGLANG_DSV4_BF16_INDEX_K": "spec.engine.indexKDtype",
    "SGLANG_OPT_USE_MULTI_STREAM_OVERLAP": "spec.engine.overlap.multiStream",
    "HF_HOME": "spec.model.cache (mounted at /models)",
    "HF_HUB_OFFLINE": "nothing: set with spec.model.cache.huggingFace (the engines read the "
    "verified snapshot only)",
}

# Role-override fields that would change the transfer format: the schema refuses them; the
# validator turns that refusal into DSV4-R011 with this hint.
TRANSFER_FORMAT_SPEC_FIELDS: dict[str, str] = {
    "indexKDtype": "spec.engine.indexKDtype",
    "kvCacheDtype": "spec.engine.kvCacheDtype",
    "pageSize": "nothing: the release sets the page size (see `dsv4 plan`)",
    "model": "spec.model",
    "attentionBackend": "spec.engine.extraArgs (--attention-backend, both roles)",
    "hicache": "spec.engine.hicache",
    "capabilities": "spec.engine.capabilities",
    "image": "spec.engine.image",
    "multiStream": "spec.engine.overlap.multiStream",
}
