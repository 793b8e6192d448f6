"""Case tables more than one test module reads: spec variants every renderer test covers, pod
settings the API server refuses (with dsv4's message and the API server's), and every spelling
of a flag the operator owns."""

from __future__ import annotations

from typing import Any

from dsv4_operator.engine.ownership import OWNED_FLAGS
from dsv4_operator.engine.releases import releases

HUB_WEIGHTS: dict[str, Any] = {
    "model.name": "deepseek-ai/DeepSeek-V4-Flash",
    "model.cache": {
        "huggingFace": {
            "revision": "v1.0",
            "tokenSecret": {"name": "hf-token"},
            "endpoint": "https://hub.example.internal",
            "storageClassName": "fast-rwx",
        }
    },
    "podTemplate": {"imagePullSecrets": [{"name": "regcred"}]},
}


VARIANTS: dict[str, dict[str, Any]] = {
    "example": {},
    "hostpath-hicache-bf16": {
        "model.cache": {"hostPath": {"path": "/models"}},
        "engine.indexKDtype": "bf16",
        "engine.capabilities": ["bf16IndexK", "indexKHiCacheGate", "poolSizingFix"],
        "engine.hicache": {"enabled": True, "sizeGB": 200},
    },
    "fp4-b200-overrides": {
        "engine.indexKDtype": "fp4",
        "gpu.product": "NVIDIA-B200",
        "decode.replicas": 2,
        "decode.tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "decode.resources": {"requests": {"cpu": "32", "memory": "256Gi"}},
        "decode.nodeSelector": {"pool": "decode"},
        "decode.overrides": {"maxRunningRequests": 48, "extraArgs": ["--enable-dp-attention"]},
        "transfer.ibDevices": "mlx5_0,mlx5_1",
        "monitoring.serviceMonitor": {"enabled": True},
    },
    "pod-settings": {
        "podTemplate": {
            "imagePullSecrets": [{"name": "engine-pull"}],
            "serviceAccountName": "dsv4-engines",
            "labels": {"team": "llm", "example.com/cost-center": "gpu"},
            "annotations": {"example.com/owner": "llm-platform"},
            "tolerations": [{"key": "example.com/reserved", "operator": "Exists"}],
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {
                                "matchExpressions": [
                                    {"key": "example.com/zone", "operator": "In", "values": ["a"]}
                                ]
                            }
                        ]
                    }
                }
            },
            "topologySpreadConstraints": [
                {
                    "maxSkew": 1,
                    "topologyKey": "kubernetes.io/hostname",
                    "whenUnsatisfiable": "ScheduleAnyway",
                    "labelSelector": {"matchLabels": {"dsv4.io/deployment": "dsv4-flash"}},
                }
            ],
            "securityContext": {"runAsNonRoot": True, "runAsUser": 1000},
            "volumes": [{"name": "rdma", "hostPath": {"path": "/dev/infiniband"}}],
            "volumeMounts": [{"name": "rdma", "mountPath": "/dev/infiniband"}],
            "env": [
                {
                    "name": "HF_TOKEN",
                    "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}},
                }
            ],
        },
        "decode.podTemplate": {"priorityClassName": "llm-critical", "labels": {"team": "dec"}},
        "router.podTemplate": {"volumes": [], "volumeMounts": [], "env": []},
    },
    "hugging-face-weights": HUB_WEIGHTS,
}


#: Pod settings the schema allows but the API server refuses (one source each; found by the
#: dry-run fuzz): (podTemplate, dsv4's message, the API server's). The integration test
#: tests/integration/test_render_dry_run.py checks the API server's against a real one.
ONE_OF_CASES: list[tuple[dict[str, Any], str, str]] = [
    (
        {"env": [{"name": "T", "valueFrom": {}}]},
        "valueFrom must set exactly one of",
        "must specify one of",
    ),
    (
        {
            "env": [
                {
                    "name": "T",
                    "valueFrom": {
                        "secretKeyRef": {"name": "s", "key": "k"},
                        "configMapKeyRef": {"name": "c", "key": "k"},
                    },
                }
            ]
        },
        "(it sets configMapKeyRef, secretKeyRef)",
        "may not have more than one field specified",
    ),
    (
        {"volumes": [{"name": "v", "emptyDir": {}, "hostPath": {"path": "/x"}}]},
        "volumes[0] (v): one volume source each, not emptyDir and hostPath",
        "may not specify more than 1 volume type",
    ),
]


def spellings_of_owned_flags() -> list[tuple[str, str]]:
    """Every spelling the release's parser accepts for an owned flag: each alias, every
    prefix argparse would expand, `_` for `-`, and the `=value` form (version, token)."""
    out: list[tuple[str, str]] = []
    for version, release in releases().items():
        for option in release.engine.options:
            names = {*option.flags, "--" + option.dest.replace("_", "-")}
            if not names & set(OWNED_FLAGS):
                continue
            for flag in option.flags:
                for end in range(4, len(flag) + 1):
                    out.append((version, flag[:end]))
                out.append((version, flag + "=1"))
                out.append((version, "--" + flag[2:].replace("-", "_")))
    return out
