"""Content hashes: the effective engine config (a revision) and the P/D transfer-format key."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping

from dsv4_operator.api.roles import Role
from dsv4_operator.api.spec import DSV4DeploymentSpec
from dsv4_operator.engine.effective import effective_role
from dsv4_operator.engine.flags import Launch, kv_checksum_on
from dsv4_operator.engine.profiles import model_profiles
from dsv4_operator.engine.releases import release
from dsv4_operator.names import REVISION_HASH_LENGTH

HASH_LENGTH = REVISION_HASH_LENGTH


def canonical_json(payload: object) -> str:
    """The canonical JSON of `payload`: sorted keys, no spaces."""
    return json.dumps(payload, sort_keys=True, separators=(",", ":"))


def json_hash(canonical: str, length: int = HASH_LENGTH) -> str:
    """SHA-256 of a canonical JSON text, hex, truncated."""
    return hashlib.sha256(canonical.encode()).hexdigest()[:length]


def canonical_hash(payload: object, length: int = HASH_LENGTH) -> str:
    """SHA-256 of the canonical JSON of `payload` (sorted keys, no spaces), hex, truncated."""
    return json_hash(canonical_json(payload), length)


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
    engine_release = release(spec.engine.sglang_version)
    paired_flags = engine_release.paired_flags if engine_release else frozenset()
    paired_env = engine_release.paired_env if engine_release else frozenset()
    # DSV4-R011 keeps the release's paired settings equal across roles; decode's view is the
    # shared one. Settings that are not set leave the payload as it was before they existed,
    # so a release that gains a setting does not move the key of specs that do not use it.
    eff = effective_role(spec, "decode")
    flags = eff.flags
    payload: dict[str, object] = {
        "model": spec.model.name,
        "profile": spec.model.profile,
        "checkpoint": spec.model.checkpoint,
        "indexKDtype": spec.engine.index_k_dtype,
        "kvCacheDtype": spec.engine.kv_cache_dtype,
        "pageSize": flags.get("--page-size", (0, str(profile.page_size if profile else "")))[1],
        "flags": {f: flags[f][1] for f in sorted(paired_flags) if f in flags},
        "env": {k: v for k, v in eff.env if k in paired_env},
    }
    if engine_release is not None and kv_checksum_on(spec, engine_release):
        payload["kvChecksum"] = True
    return canonical_hash(payload)


__all__ = [
    "canonical_hash",
    "canonical_json",
    "config_hash",
    "json_hash",
    "transfer_format_key",
]
