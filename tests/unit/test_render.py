"""Rendered children: valid Kubernetes 1.37 objects, deterministic, wired as the design says."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import kubernetes_validate
import pytest
import yaml

from dsv4_operator.api.spec import DSV4DeploymentSpec
from dsv4_operator.engine.effective import parse_args
from dsv4_operator.engine.validation import validate_spec
from dsv4_operator.render.children import render_spec
from dsv4_operator.render.context import OwnerRef, build_context
from tests.support.cases import HUB_WEIGHTS, ONE_OF_CASES, VARIANTS
from tests.support.paths import REPO

TOOLS = REPO / "tools"

K8S_VERSION = "1.37"
GOLDEN = REPO / "tests" / "unit" / "golden" / "dsv4-children.yaml"
OWNER = OwnerRef("dsv4.io/v1alpha1", "DSV4Deployment", "dsv4-flash", "0000-uid")


def _render(spec: dict[str, Any], owner: OwnerRef | None = None) -> list[dict[str, Any]]:
    return render_spec("dsv4-flash", "default", DSV4DeploymentSpec.model_validate(spec), owner)


def _by(objs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    return next(o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name)


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_every_builtin_child_validates_against_kubernetes_schema(
    name: str, variant: Callable[..., dict[str, Any]]
) -> None:
    objs = _render(variant(VARIANTS[name]), OWNER)
    custom = ("monitoring.coreos.com/v1", "dsv4.io/v1alpha1")  # a ServiceMonitor, a DSV4Model
    builtin = [o for o in objs if o["apiVersion"] not in custom]
    assert len(builtin) >= 9
    for obj in builtin:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


def test_hub_weights_render_a_claim_a_job_and_rights_for_that_job_only(
    variant: Callable[..., dict[str, Any]],
) -> None:
    objs = _render(variant(HUB_WEIGHTS), OWNER)
    claim = _by(objs, "PersistentVolumeClaim", "dsv4-flash-weights")
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    assert claim["spec"]["storageClassName"] == "fast-rwx"
    job = next(o for o in objs if o["kind"] == "Job")
    assert job["metadata"]["name"].startswith("dsv4-flash-weights-")
    pod = job["spec"]["template"]["spec"]
    env = {e["name"]: e for e in pod["containers"][0]["env"]}
    assert env["DSV4_WEIGHTS_REPO"]["value"] == "deepseek-ai/DeepSeek-V4-Flash"
    assert env["DSV4_WEIGHTS_REVISION"]["value"] == "v1.0"
    assert env["HF_ENDPOINT"]["value"] == "https://hub.example.internal"
    assert env["HF_TOKEN"]["valueFrom"] == {"secretKeyRef": {"name": "hf-token", "key": "token"}}
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    assert pod["serviceAccountName"] == "dsv4-flash-weights"
    role = _by(objs, "Role", "dsv4-flash-weights")
    assert role["rules"] == [
        {
            "apiGroups": ["batch"],
            "resources": ["jobs"],
            "resourceNames": [job["metadata"]["name"]],
            "verbs": ["get", "patch"],
        }
    ]
    # Permanent failures (401, 404, disk full, checksum) end the Job at once.
    codes = job["spec"]["podFailurePolicy"]["rules"][0]["onExitCodes"]["values"]
    assert codes == [3, 4, 5, 6]
    # The engines mount the claim read-only, run offline, and load the same revision; the
    # token is the download Job's only.
    for role_name in ("dsv4-flash-prefill", "dsv4-flash-decode"):
        sts = _by(objs, "StatefulSet", role_name)
        tpl = sts["spec"]["template"]["spec"]
        volume = next(v for v in tpl["volumes"] if v["name"] == "models")
        assert volume["persistentVolumeClaim"] == {
            "claimName": "dsv4-flash-weights",
            "readOnly": True,
        }
        engine = tpl["containers"][0]
        assert engine["command"][engine["command"].index("--revision") + 1] == "v1.0"
        engine_env = {e["name"]: e.get("value") for e in engine["env"]}
        assert engine_env["HF_HUB_OFFLINE"] == "1" and "HF_TOKEN" not in engine_env


def test_the_tap_sits_in_front_of_the_router_unless_turned_off(
    variant: Callable[..., dict[str, Any]],
) -> None:
    objs = _render(variant({}), OWNER)
    router = _by(objs, "Deployment", "dsv4-flash-router")["spec"]["template"]["spec"]
    tap = next(c for c in router["containers"] if c["name"] == "tap")
    assert tap["image"] == "registry.example.com/dsv4-operator:0.1.0"
    assert tap["args"][:3] == ["tap", "--upstream", "http://127.0.0.1:8000"]
    service = _by(objs, "Service", "dsv4-flash-router")
    ports = {p["name"]: p for p in service["spec"]["ports"]}
    assert ports["api"]["targetPort"] == "tap" and ports["api"]["port"] == 8000
    assert ports["tap-metrics"]["targetPort"] == "tap-metrics"
    for off in ({"guard.tap.enabled": False}, {"guard.enabled": False}):
        plain = _render(variant(off), OWNER)
        router = _by(plain, "Deployment", "dsv4-flash-router")["spec"]["template"]["spec"]
        assert [c["name"] for c in router["containers"]] == ["router"]
        service = _by(plain, "Service", "dsv4-flash-router")
        assert [p["targetPort"] for p in service["spec"]["ports"]] == ["api", "metrics"]


def test_tap_workers_are_passed_on_and_size_the_default_resources(
    variant: Callable[..., dict[str, Any]],
) -> None:
    def tap_of(change: dict[str, Any]) -> dict[str, Any]:
        objs = _render(variant(change), OWNER)
        router = _by(objs, "Deployment", "dsv4-flash-router")["spec"]["template"]["spec"]
        return dict(next(c for c in router["containers"] if c["name"] == "tap"))

    one = tap_of({})
    assert "--workers" not in one["args"]  # the default keeps the pod template it had
    assert one["resources"]["requests"] == {"cpu": "500m", "memory": "256Mi"}
    three = tap_of({"guard.tap.workers": 3})
    assert three["args"][-2:] == ["--workers", "3"]
    assert three["resources"] == {
        "requests": {"cpu": "1500m", "memory": "768Mi"},
        "limits": {"memory": "3Gi"},
    }
    sized = {"requests": {"cpu": "2"}, "limits": {"memory": "2Gi"}}
    assert tap_of({"guard.tap.workers": 3, "guard.tap.resources": sized})["resources"] == sized
    validation = validate_spec(variant({"guard.tap.workers": 17}))
    assert not validation.valid
    assert validation.errors[0].field == "spec.guard.tap.workers"


def test_a_new_revision_is_a_new_job(variant: Callable[..., dict[str, Any]]) -> None:
    def job_of(revision: str) -> str:
        change = dict(HUB_WEIGHTS)
        change["model.cache"] = {"huggingFace": {"revision": revision}}
        objs = _render(variant(change), OWNER)
        return str(next(o for o in objs if o["kind"] == "Job")["metadata"]["name"])

    assert job_of("v1.0") == job_of("v1.0") != job_of("v1.1")


@pytest.mark.parametrize("storage", [0, "0", "0Gi", "0.0Ti", "0e3"])
def test_a_hub_claim_of_size_zero_is_refused(
    variant: Callable[..., dict[str, Any]], storage: int | str
) -> None:
    change = dict(HUB_WEIGHTS, **{"model.cache": {"huggingFace": {"storage": storage}}})
    validation = validate_spec(variant(change))
    assert not validation.valid
    assert (
        "storage" in validation.errors[0].message and "more than 0" in validation.errors[0].message
    )
    ok = dict(HUB_WEIGHTS, **{"model.cache": {"huggingFace": {"storage": "0.5Ti"}}})
    assert validate_spec(variant(ok)).valid


def test_a_hub_source_needs_a_repo_id(variant: Callable[..., dict[str, Any]]) -> None:
    change = dict(HUB_WEIGHTS, **{"model.name": "/models/DeepSeek-V4-Flash"})
    validation = validate_spec(variant(change))
    assert not validation.valid
    assert "must be a Hugging Face repo id" in validation.errors[0].message


def test_schema_validation_catches_a_broken_object(example_spec: DSV4DeploymentSpec) -> None:
    """The validator is not a no-op: a misspelled field is rejected."""
    sts = copy.deepcopy(render_spec("x", "default", example_spec)[1])
    sts["spec"]["replica"] = 1
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(sts, K8S_VERSION, strict=True)


def test_golden_example(example_spec: DSV4DeploymentSpec) -> None:
    rendered = yaml.safe_dump_all(
        render_spec("dsv4-flash", "default", example_spec, OWNER), sort_keys=True, width=100
    )
    assert GOLDEN.read_text() == rendered, (
        "rendered children changed; if intended, regenerate with "
        "`python -m tests.unit.test_render` and review the diff"
    )


def test_names_labels_and_owner(example_spec: DSV4DeploymentSpec) -> None:
    objs = render_spec("dsv4-flash", "default", example_spec, OWNER)
    names = {(o["kind"], o["metadata"]["name"]) for o in objs}
    assert ("StatefulSet", "dsv4-flash-prefill") in names
    assert ("StatefulSet", "dsv4-flash-decode") in names
    assert ("Deployment", "dsv4-flash-router") in names
    for obj in objs:
        assert obj["metadata"]["ownerReferences"][0]["uid"] == "0000-uid"
        assert obj["metadata"]["labels"]["dsv4.io/deployment"] == "dsv4-flash"
    assert all(
        "ownerReferences" not in o["metadata"]
        for o in render_spec("dsv4-flash", "default", example_spec)
    )


def test_gpu_requests_node_selector_and_probes(variant: Callable[..., dict[str, Any]]) -> None:
    objs = _render(variant(VARIANTS["fp4-b200-overrides"]))
    decode = _by(objs, "StatefulSet", "dsv4-flash-decode")
    pod = decode["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 4
    assert container["resources"]["requests"]["cpu"] == "32"
    assert pod["nodeSelector"] == {"pool": "decode", "nvidia.com/gpu.product": "NVIDIA-B200"}
    assert decode["spec"]["replicas"] == 2
    startup = container["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 60 * 60
    assert container["readinessProbe"]["httpGet"]["path"] == "/health_generate"
    assert {"name": "dshm", "mountPath": "/dev/shm"} in container["volumeMounts"]


def test_router_targets_every_pod_with_bootstrap_port(
    variant: Callable[..., dict[str, Any]],
) -> None:
    spec = variant({"prefill.replicas": 2, "decode.replicas": 3, "transfer.bootstrapPort": 9001})
    objs = _render(spec)
    command = _by(objs, "Deployment", "dsv4-flash-router")["spec"]["template"]["spec"][
        "containers"
    ][0]["command"]
    prefills = [command[i + 1 : i + 3] for i, a in enumerate(command) if a == "--prefill"]
    decodes = [command[i + 1] for i, a in enumerate(command) if a == "--decode"]
    assert prefills == [
        [f"http://dsv4-flash-prefill-{i}.dsv4-flash-prefill.default.svc:30000", "9001"]
        for i in range(2)
    ]
    assert len(decodes) == 3 and "--pd-disaggregation" in command
    prefill = _by(objs, "StatefulSet", "dsv4-flash-prefill")["spec"]["template"]["spec"]
    flags = parse_args(prefill["containers"][0]["command"])
    assert flags["--disaggregation-bootstrap-port"][1] == "9001"
    ports = {p["name"]: p["containerPort"] for p in prefill["containers"][0]["ports"]}
    assert ports["bootstrap"] == 9001


def test_engine_flags_and_env(variant: Callable[..., dict[str, Any]]) -> None:
    objs = _render(variant(VARIANTS["hostpath-hicache-bf16"]))
    ctx_plan = build_context(
        "dsv4-flash",
        "default",
        DSV4DeploymentSpec.model_validate(variant(VARIANTS["hostpath-hicache-bf16"])),
    ).plan
    for role in ("prefill", "decode"):
        container = _by(objs, "StatefulSet", f"dsv4-flash-{role}")["spec"]["template"]["spec"][
            "containers"
        ][0]
        flags = parse_args(container["command"])
        env = {e["name"]: e["value"] for e in container["env"]}
        assert flags["--disaggregation-mode"][1] == role
        assert flags["--max-total-tokens"][1] == str(ctx_plan.roles[role].max_total_tokens)
        assert "--disable-overlap-schedule" in flags
        # PD decode disables the radix cache HiCache extends: HiCache runs on prefill only
        assert flags.get("--hicache-size", (0, None))[1] == ("200" if role == "prefill" else None)
        assert env["SGLANG_DSV4_BF16_INDEX_K"] == "1"
        assert env["SGLANG_OPT_USE_MULTI_STREAM_OVERLAP"] == "0"


def test_revision_changes_only_with_engine_config(variant: Callable[..., dict[str, Any]]) -> None:
    def ctx(changes: dict[str, Any]) -> Any:
        return build_context("x", "ns", DSV4DeploymentSpec.model_validate(variant(changes)))

    base = ctx({})
    assert ctx({"decode.replicas": 3}).revision == base.revision
    assert ctx({"guard.canary.sessions": 16}).revision == base.revision
    assert ctx({"engine.maxRunningRequests": 32}).revision != base.revision
    # maxRunningRequests is role-safe: the transfer format stays; index-K dtype changes it.
    assert ctx({"engine.maxRunningRequests": 32}).transfer_format == base.transfer_format
    bf16 = {"engine.indexKDtype": "bf16"}
    assert ctx(bf16).transfer_format != base.transfer_format
    assert ctx({"engine.extraArgs": ["--page-size", "512"]}).transfer_format != base.transfer_format


if __name__ == "__main__":  # regenerate the golden file
    doc = yaml.safe_load((REPO / "examples" / "dsv4.yaml").read_text())
    spec = DSV4DeploymentSpec.model_validate(doc["spec"])
    GOLDEN.write_text(
        yaml.safe_dump_all(
            render_spec("dsv4-flash", "default", spec, OWNER), sort_keys=True, width=100
        )
    )


def test_pod_settings_land_in_every_pod_after_what_the_operator_owns(
    variant: Callable[..., dict[str, Any]],
) -> None:
    objs = _render(variant(VARIANTS["pod-settings"]))
    decode = _by(objs, "StatefulSet", "dsv4-flash-decode")["spec"]["template"]
    prefill = _by(objs, "StatefulSet", "dsv4-flash-prefill")["spec"]["template"]
    router = _by(objs, "Deployment", "dsv4-flash-router")["spec"]["template"]
    for pod in (decode, prefill, router):
        spec = pod["spec"]
        assert spec["imagePullSecrets"] == [{"name": "engine-pull"}]
        assert spec["serviceAccountName"] == "dsv4-engines"
        assert spec["automountServiceAccountToken"] is False  # still no API token
        assert spec["securityContext"] == {
            "seccompProfile": {"type": "RuntimeDefault"},
            "runAsNonRoot": True,
            "runAsUser": 1000,
        }
        assert pod["metadata"]["labels"]["dsv4.io/deployment"] == "dsv4-flash"
        assert pod["metadata"]["annotations"] == {"example.com/owner": "llm-platform"}
        assert {"key": "example.com/reserved", "operator": "Exists"} in spec["tolerations"]
    # The role's settings on top: its own field replaces, labels merge.
    assert decode["spec"]["priorityClassName"] == "llm-critical"
    assert "priorityClassName" not in prefill["spec"]
    assert decode["metadata"]["labels"]["team"] == "dec"
    assert prefill["metadata"]["labels"]["team"] == "llm"
    assert decode["metadata"]["labels"]["example.com/cost-center"] == "gpu"
    # Engines: the operator's volumes, mounts and env first, the user's after.
    engine = decode["spec"]["containers"][0]
    assert [v["name"] for v in decode["spec"]["volumes"]] == ["models", "dshm", "rdma"]
    assert [m["name"] for m in engine["volumeMounts"]] == ["models", "dshm", "rdma"]
    assert engine["env"][-1] == {
        "name": "HF_TOKEN",
        "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}},
    }
    # The router emptied its lists: no extra volume (the tap's own only), mount or env there.
    assert [v["name"] for v in router["spec"]["volumes"]] == ["tap-tmp"]
    assert "env" not in router["spec"]["containers"][0]


@pytest.mark.parametrize(
    ("pod_template", "message"),
    [
        ({"labels": {"dsv4.io/role": "x"}}, "key 'dsv4.io/role' is the operator's"),
        ({"annotations": {"app.kubernetes.io/name": "x"}}, "is the operator's"),
        ({"volumes": [{"name": "models", "emptyDir": {}}]}, "'models' is the operator's"),
        ({"volumes": [{"emptyDir": {}}]}, "every volume needs a name"),
        (
            {
                "volumes": [{"name": "v", "emptyDir": {}}],
                "volumeMounts": [{"name": "v", "mountPath": "/models/extra"}],
            },
            "where the operator mounts",
        ),
        (
            {"volumeMounts": [{"name": "nope", "mountPath": "/x"}]},
            "'nope' is not among the volumes",
        ),
        ({"env": [{"name": "SGLANG_X", "value": "1"}]}, "use spec.engine.env"),
        ({"env": [{"name": "HF_HOME", "value": "/x"}]}, "use spec.engine.env"),
        ({"env": [{"name": "T"}]}, "exactly one of value and valueFrom"),
        *((change, ours) for change, ours, _ in ONE_OF_CASES),
        ({"imagePullSecrets": [{"name": "Bad_Name"}]}, "String should match pattern"),
    ],
)
def test_pod_settings_that_take_what_the_operator_owns_are_refused(
    pod_template: dict[str, Any], message: str, variant: Callable[..., dict[str, Any]]
) -> None:
    from dsv4_operator.engine.validation import validate_spec

    validation = validate_spec(variant({"podTemplate": pod_template}))
    assert not validation.valid
    assert any(message in f.message for f in validation.errors), [
        (f.field, f.message) for f in validation.errors
    ]
    assert all(f.field.startswith("spec") for f in validation.errors)


@pytest.mark.parametrize(
    ("pod_template", "message"),
    [
        ({"affinity": {"nodeAfinity": {}}}, "affinity is not a valid core/v1 Affinity"),
        (
            {"volumes": [{"name": "x", "hostPath": {"path": 3}}]},
            "volumes[0] is not a valid core/v1 Volume: hostPath.path",
        ),
        (
            {"env": [{"name": "T", "valueFrom": {"secretKeyRef": {"key": "k", "nam": "s"}}}]},
            "env[0].valueFrom is not a valid core/v1 EnvVarSource",
        ),
        (
            {"topologySpreadConstraints": [{"maxSkew": 1}]},
            "'topologyKey' is a required property",
        ),
        ({"securityContext": {"runAsUser": "root"}}, "securityContext is not a valid"),
    ],
)
def test_free_form_pod_settings_are_checked_against_the_kubernetes_schema(
    pod_template: dict[str, Any], message: str, variant: Callable[..., dict[str, Any]]
) -> None:
    from dsv4_operator.engine.validation import validate_spec

    validation = validate_spec(variant({"podTemplate": pod_template}))
    assert [f.message for f in validation.errors if message in f.message], [
        f.message for f in validation.errors
    ]


def test_the_packaged_kubernetes_schemas_are_current() -> None:
    """operator/dsv4_operator/api/data/k8s-pod-settings.schema.json is what
    tools/gen_pod_schemas.py extracts from the pinned kubernetes-validate."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("gen_pod_schemas", TOOLS / "gen_pod_schemas.py")
    assert spec is not None and spec.loader is not None
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    assert tool.OUT.read_text() == tool.build(), "stale: run python tools/gen_pod_schemas.py"


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"podTemplate": {"imagePullSecrets": [{"name": "a"}, {"name": "a"}]}}, "a more than once"),
        (
            {"podTemplate": {"env": [{"name": "T", "value": "1"}, {"name": "T", "value": "2"}]}},
            "T more than once",
        ),
        (
            {
                "engine.env": [{"name": "NCCL_IB_HCA", "value": "mlx5"}],
                "podTemplate": {"env": [{"name": "NCCL_IB_HCA", "value": "mlx5_1"}]},
            },
            "NCCL_IB_HCA also in spec.engine.env",
        ),
        ({"decode.resources": {"requests": {"0": "1"}}}, "resource '0'"),
        ({"decode.resources": {"requests": {"kubernetes.io/x": "1"}}}, "fully qualified"),
        ({"decode.resources": {"requests": {"memory": "1e1.5"}}}, "String should match pattern"),
    ],
)
def test_what_server_side_apply_or_core_validation_refuses_is_refused(
    changes: dict[str, Any], message: str, variant: Callable[..., dict[str, Any]]
) -> None:
    from dsv4_operator.engine.validation import validate_spec

    validation = validate_spec(variant(changes))
    assert [f for f in validation.errors if message in f.message], [
        f.message for f in validation.errors
    ]


def test_request_bodies_carry_no_character_yaml_refuses() -> None:
    """The operator's apply bodies are read as YAML: DEL and C1 controls go as \\u escapes,
    non-BMP characters as raw UTF-8 (YAML refuses surrogate escapes)."""
    from dsv4_operator.kube.client import yaml_safe_json

    value = "a" + chr(0x7F) + "b" + chr(0x85) + "c" + chr(0x2028) + chr(0x1F600) + chr(0xE9)
    body = yaml_safe_json({"v": value}).decode()
    assert body == '{"v": "a\\u007fb\\u0085c\\u2028' + chr(0x1F600) + chr(0xE9) + '"}'
    assert yaml.safe_load(body) == {"v": value}  # NEL and U+2028 would fold to a space raw
