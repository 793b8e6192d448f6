"""Pod settings a cluster asks of every pod (pull secrets, service account, placement,
security context, extra volumes, env from Secrets): `spec.podTemplate`, per role overridable.

The operator keeps what makes the deployment correct: its flags and env names, the GPU
resources and product selector, the weights and shared-memory volumes, its labels. A setting
that would take one of those is refused with the field to use instead.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, model_validator

from dsv4_operator.api.base import ApiModel
from dsv4_operator.api.kube_schema import (
    AFFINITY,
    ENV_VAR_SOURCE,
    POD_SECURITY_CONTEXT,
    TOPOLOGY_SPREAD,
    VOLUME,
    kubernetes_error,
)
from dsv4_operator.api.kube_types import ENV_NAME_PATTERN, LabelKey, LabelValue, Toleration

# An object the API server validates itself (through the webhook's dry run of the children):
# kept whole, not pruned.
FreeForm = Annotated[
    dict[str, Any], Field(json_schema_extra={"x-kubernetes-preserve-unknown-fields": True})
]
DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
# Owned by the operator: its label and annotation keys, its volumes and where they mount,
# and env names with a spec field of their own (or read by the engine: spec.engine.env).
OWNED_KEY_PREFIXES = ("dsv4.io/", "app.kubernetes.io/")
OWNED_VOLUMES = ("models", "dshm", "tap-tmp")
OWNED_MOUNT_PATHS = ("/models", "/dev/shm")
ENGINE_ENV_PREFIXES = ("SGLANG_", "SGL_", "DSV4_")


class LocalObjectReference(ApiModel):
    """A Secret in the deployment's namespace."""

    name: str = Field(max_length=253, pattern=DNS_SUBDOMAIN, description="Secret name.")


class VolumeMount(ApiModel):
    """A mount of one of `volumes` into the main container."""

    name: str = Field(max_length=63, pattern=DNS_LABEL, description="Volume name.")
    mount_path: str = Field(max_length=4096, pattern=r"^/", description="Absolute path.")
    read_only: bool | None = Field(default=None, description="Mount read-only.")
    sub_path: str | None = Field(default=None, max_length=4096, description="Sub-path.")


class PodEnvVar(ApiModel):
    """An env variable for the main container: a value, or `valueFrom` (Secret, ConfigMap)."""

    name: str = Field(
        min_length=1, max_length=256, pattern=ENV_NAME_PATTERN, description="Variable name."
    )
    value: str | None = Field(default=None, max_length=32768, description="Literal value.")
    value_from: FreeForm | None = Field(
        default=None, description="core/v1 EnvVarSource (secretKeyRef, configMapKeyRef, ...)."
    )

    @model_validator(mode="after")
    def _one_source(self) -> PodEnvVar:
        if (self.value is None) == (self.value_from is None):
            raise ValueError(f"env {self.name}: set exactly one of value and valueFrom")
        # The schema leaves every source optional; the API server wants exactly one.
        if self.value_from is not None and len(_set_keys(self.value_from)) != 1:
            raise ValueError(
                f"env {self.name}: valueFrom must set exactly one of secretKeyRef, "
                f"configMapKeyRef, fieldRef, resourceFieldRef or fileKeyRef (it sets "
                f"{', '.join(_set_keys(self.value_from)) or 'none'})"
            )
        return self


def _set_keys(obj: dict[str, Any], but: tuple[str, ...] = ()) -> list[str]:
    """The keys of `obj` given a value (null is unset to the API server), except `but`."""
    return sorted(key for key, value in obj.items() if value is not None and key not in but)


class PodSettings(ApiModel):
    """Settings for every pod of a component; see the module docstring for what is owned."""

    image_pull_secrets: list[LocalObjectReference] = Field(
        default_factory=list, max_length=16, description="Secrets to pull the images with."
    )
    service_account_name: str | None = Field(
        default=None, max_length=253, pattern=DNS_SUBDOMAIN, description="ServiceAccount."
    )
    priority_class_name: str | None = Field(
        default=None, max_length=253, pattern=DNS_SUBDOMAIN, description="PriorityClass."
    )
    labels: dict[LabelKey, LabelValue] = Field(
        default_factory=dict, max_length=64, description="Extra pod labels."
    )
    annotations: dict[LabelKey, Annotated[str, Field(max_length=65536)]] = Field(
        default_factory=dict, max_length=64, description="Extra pod annotations."
    )
    tolerations: list[Toleration] = Field(
        default_factory=list, max_length=32, description="Extra tolerations."
    )
    affinity: FreeForm | None = Field(default=None, description="core/v1 Affinity.")
    topology_spread_constraints: list[FreeForm] = Field(
        default_factory=list, max_length=8, description="core/v1 TopologySpreadConstraints."
    )
    security_context: FreeForm | None = Field(
        default=None,
        description="core/v1 PodSecurityContext (the operator's seccompProfile RuntimeDefault "
        "applies unless this sets one).",
    )
    volumes: list[FreeForm] = Field(
        default_factory=list, max_length=16, description="Extra core/v1 Volumes."
    )
    volume_mounts: list[VolumeMount] = Field(
        default_factory=list, max_length=16, description="Mounts of `volumes`."
    )
    env: list[PodEnvVar] = Field(
        default_factory=list, max_length=64, description="Extra env (for example a token)."
    )

    @model_validator(mode="after")
    def _nothing_owned(self) -> PodSettings:
        for kind, keys in (("labels", self.labels), ("annotations", self.annotations)):
            for key in keys:
                if key.startswith(OWNED_KEY_PREFIXES):
                    raise ValueError(
                        f"{kind}: key {key!r} is the operator's ({', '.join(OWNED_KEY_PREFIXES)}"
                        "): use another key"
                    )
        for volume in self.volumes:
            name = volume.get("name")
            if not isinstance(name, str) or not name:
                raise ValueError("volumes: every volume needs a name")
            if name in OWNED_VOLUMES:
                raise ValueError(
                    f"volumes: {name!r} is the operator's (the weights and shared memory: "
                    "spec.model.cache); use another name"
                )
        for mount in self.volume_mounts:
            path = mount.mount_path.rstrip("/") or "/"
            if any(path == p or path.startswith(p + "/") for p in OWNED_MOUNT_PATHS) or path == "/":
                raise ValueError(
                    f"volumeMounts: {mount.mount_path!r} is where the operator mounts the "
                    "weights or shared memory; mount elsewhere"
                )
        # Server-side apply merges these lists by key and refuses a key twice.
        named: tuple[tuple[str, list[str]], ...] = (
            ("imagePullSecrets", [s.name for s in self.image_pull_secrets]),
            ("volumes", [str(v.get("name")) for v in self.volumes]),
            ("volumeMounts", [m.mount_path for m in self.volume_mounts]),
            ("env", [e.name for e in self.env]),
        )
        for field, entries in named:
            if twice := sorted({k for k in entries if entries.count(k) > 1}):
                raise ValueError(f"{field}: {', '.join(twice)} more than once")
        for var in self.env:
            if var.name.startswith(ENGINE_ENV_PREFIXES) or var.name == "HF_HOME":
                raise ValueError(
                    f"env: {var.name} is read by the engine or set by the operator: use "
                    "spec.engine.env (or spec.<role>.overrides.env), which the rules check"
                )
        return self

    @model_validator(mode="after")
    def _as_the_api_server_reads_them(self) -> PodSettings:
        checks: list[tuple[str, str, Any]] = [
            ("affinity", AFFINITY, self.affinity),
            ("securityContext", POD_SECURITY_CONTEXT, self.security_context),
            *(
                (f"topologySpreadConstraints[{i}]", TOPOLOGY_SPREAD, c)
                for i, c in enumerate(self.topology_spread_constraints)
            ),
            *((f"volumes[{i}]", VOLUME, v) for i, v in enumerate(self.volumes)),
            *(
                (f"env[{i}].valueFrom", ENV_VAR_SOURCE, e.value_from)
                for i, e in enumerate(self.env)
            ),
        ]
        for field, definition, value in checks:
            if value is not None and (why := kubernetes_error(definition, value)):
                raise ValueError(
                    f"{field} is not a valid core/v1 {definition.rsplit('.', 1)[-1]}: {why}"
                )
        for i, volume in enumerate(self.volumes):
            # No source is an emptyDir to the API server; two are refused.
            if len(sources := _set_keys(volume, but=("name",))) > 1:
                raise ValueError(
                    f"volumes[{i}] ({volume.get('name')}): one volume source each, not "
                    f"{' and '.join(sources)}"
                )
        return self

    def merged(self, override: PodSettings | None) -> PodSettings:
        """These settings with `override`'s on top: a field the override sets replaces this
        one's; labels and annotations merge (the override wins per key)."""
        if override is None:
            return self
        fields = {name: getattr(override, name) for name in override.model_fields_set}
        fields["labels"] = {**self.labels, **override.labels}
        fields["annotations"] = {**self.annotations, **override.annotations}
        return self.model_copy(update=fields)

    def check_mounts(self, component: str) -> None:
        """Every mount names a volume of these (merged) settings of `component`."""
        names = {v.get("name") for v in self.volumes}
        for mount in self.volume_mounts:
            if mount.name not in names:
                raise ValueError(
                    f"{component} podTemplate.volumeMounts: {mount.name!r} is not among the "
                    "volumes of spec.podTemplate or the component's own podTemplate"
                )
