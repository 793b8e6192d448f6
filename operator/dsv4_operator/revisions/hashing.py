"""Content hashes: the effective engine config (a revision) and the P/D transfer-format key."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping

from dsv4_operator.api.roles import Role
from dsv4_operator.api.spec import DSV4DeploymentSpec
from dsv4_operator.engine.effective import effective_role
from dsv4_operator.engine.flags import Launch
from dsv4_operator.engine.ownership import TRANSFER_FORMAT_ENV, TRANSFER_FORMAT_FLAGS
from dsv4_operator.engine.profiles import model_profiles
from dsv4_operator.names import REVISION_HASH_LENGTH

HASH_LENGTH = REVISION_HASH_LENGTH


def canonical_hash(payload: object, length: int = HASH_LENGTH) -> str:
    """SHA-256 of the canonical JSON of `payload` (sorted keys, no spaces), hex, truncated."""
    canonical = json.dumps(payload, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:length]


def config_hash(image: str, launches: Mapping[Role, Launch], gpus: Mapping[Role, int]) -> str:
    """Hash of what the engines run: image, argv, env and GPUs per role (not replica counts)."""
    return canonical_hash(
        {
            "image": image,
            "roles": {
                role: {"command": list(launch.command), "env": dict(launch.env), "gpus": gpus[role]}
                for role, launch in sorted(launches.items())
            },
        }
    )


def transfer_format_key(spec: DSV4DeploymentSpec) -> str:
    """Hash of everything that changes what travels between prefill and decode.

    Two revisions with the same key can run old prefill against new decode; different keys
    must never be mixed (transfer-format epochs, docs/engine-notes.md#transfer-format).
    """
    profile = model_profiles().get(spec.model.profile)
    # Rules DSV4-R011 keep these equal across roles; decode's view is the shared one.
    eff = effective_role(spec, "decode")
    flags = eff.flags
    return canonical_hash(
        {
            "model": spec.model.name,
            "profile": spec.model.profile,
            "checkpoint": spec.model.checkpoint,
            "indexKDtype": spec.engine.index_k_dtype,
            "kvCacheDtype": spec.engine.kv_cache_dtype,
            "pageSize": flags.get("--page-size", (0, str(profile.page_size if profile else "")))[1],
            "flags": {f: flags[f][1] for f in sorted(TRANSFER_FORMAT_FLAGS) if f in flags},
            "env": {k: v for k, v in eff.env if k in TRANSFER_FORMAT_ENV},
        }
    )


__all__ = ["canonical_hash", "config_hash", "transfer_format_key"]
