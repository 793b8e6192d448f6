"""The Helm chart, rendered by the real helm binary: lint, schema, Kubernetes 1.37 validation,
and the properties the operator depends on (ports, probes, RBAC, webhook wiring, certificates).

What needs an API server (install, RBAC under a real token, the webhook configuration kopf
creates) is in tests/integration/test_chart.py.
"""

from __future__ import annotations

import base64
import datetime
import json
import re
from typing import TYPE_CHECKING, Any

import kubernetes_validate
import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa

from .support import (
    CHART,
    CRD_RULE,
    DASHBOARD_FILE,
    NAMESPACE_RULE,
    NAMESPACED_RULES,
    REPO,
    RULES_FILE,
    by_kind,
    helm_args,
    one,
    render,
    run,
    tool,
)

if TYPE_CHECKING:
    from dsv4_operator.settings import OperatorSettings

# Kinds from CRDs the Kubernetes schemas do not know: checked structurally below instead.
CUSTOM_GROUPS = ("monitoring.coreos.com/", "cert-manager.io/")

ALL_FEATURES: dict[str, Any] = {
    "watchNamespaces": ["llm-a", "llm-b"],
    "webhook": {"certificate": {"source": "certManager"}},
    "metrics": {"serviceMonitor": {"enabled": True}},
    "prometheusRule": {"enabled": True},
}
VALUE_SETS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "namespaced-certmanager-monitoring": ALL_FEATURES,
    "no-webhook-no-dashboard": {
        "webhook": {"enabled": False},
        "grafanaDashboard": {"enabled": False},
        "metrics": {"service": {"enabled": False}},
    },
    "cert-manager-issuer": {
        "webhook": {
            "certificate": {
                "source": "certManager",
                "certManager": {"issuerRef": {"name": "corp-ca", "kind": "ClusterIssuer"}},
            }
        }
    },
}


def _container(objects: list[dict[str, Any]]) -> dict[str, Any]:
    containers: list[dict[str, Any]] = one(objects, "Deployment")["spec"]["template"]["spec"][
        "containers"
    ]
    assert len(containers) == 1
    return containers[0]


def _env(objects: list[dict[str, Any]]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in _container(objects)["env"]}


def _operator_settings(env: dict[str, str]) -> OperatorSettings:
    """The operator's settings from the environment the chart sets (DSV4_* variables)."""
    from dsv4_operator.settings import OperatorSettings

    fields: dict[str, Any] = {k.removeprefix("DSV4_").lower(): v for k, v in env.items()}
    return OperatorSettings(**fields)


def _port(objects: list[dict[str, Any]], name: str) -> int:
    ports = {p["name"]: int(p["containerPort"]) for p in _container(objects)["ports"]}
    return ports[name]


CRD_FILES = ("dsv4.io_dsv4deployments.yaml", "dsv4.io_dsv4models.yaml")


def test_chart_crd_is_a_copy_of_the_generated_crd() -> None:
    for name in CRD_FILES:
        chart_crd = CHART / "files" / "crds" / name
        source = REPO / "crds" / name
        assert chart_crd.read_bytes() == source.read_bytes(), (
            "charts/dsv4-operator/files/crds/ drifted from crds/: "
            f"cp crds/{name} charts/dsv4-operator/files/crds/"
        )
    assert not (CHART / "crds").exists(), "crds/ is installed once and never upgraded by Helm"


def test_the_chart_installs_and_keeps_the_crd_unless_told_not_to() -> None:
    crds = by_kind(render(), "CustomResourceDefinition")
    assert len(crds) == len(CRD_FILES)  # DSV4Deployment and DSV4Model
    for crd, name in zip(crds, CRD_FILES, strict=True):
        source = yaml.safe_load((REPO / "crds" / name).read_text())
        assert crd["spec"] == source["spec"]
        assert crd["metadata"]["name"] == source["metadata"]["name"]
        assert crd["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}
        assert crd["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm"
    unkept = by_kind(render({"crds": {"keep": False}}), "CustomResourceDefinition")
    assert len(unkept) == len(CRD_FILES)
    assert all("annotations" not in crd["metadata"] for crd in unkept)
    assert not by_kind(render({"crds": {"enabled": False}}), "CustomResourceDefinition")


@pytest.mark.parametrize("values", VALUE_SETS.values(), ids=VALUE_SETS.keys())
def test_helm_lint_strict_passes(values: dict[str, Any]) -> None:
    proc = run([tool("helm"), "lint", "--strict", CHART, *helm_args(values)])
    assert "1 chart(s) linted, 0 chart(s) failed" in proc.stdout


@pytest.mark.parametrize("values", VALUE_SETS.values(), ids=VALUE_SETS.keys())
def test_rendered_objects_validate_against_kubernetes_1_37(values: dict[str, Any]) -> None:
    objects = render(values, tests=True)
    builtin = [o for o in objects if not o["apiVersion"].startswith(CUSTOM_GROUPS)]
    errors = []
    for obj in builtin:
        try:
            kubernetes_validate.validate(obj, "1.37", strict=True)
        except kubernetes_validate.ValidationError as error:
            errors.append(f"{obj['kind']}/{obj['metadata']['name']}: {error}")
    assert not errors, "\n".join(errors)
    kinds = {o["kind"] for o in builtin}
    assert {"CustomResourceDefinition", "Deployment", "ServiceAccount", "ClusterRole"} <= kinds
    for obj in objects:  # namespaced objects land in the release namespace unless told
        if obj["kind"] in {"Deployment", "Service", "Secret", "ServiceAccount", "ConfigMap"}:
            assert obj["metadata"]["namespace"] == "dsv4-system"


# The `helm test` pod's Roles: release objects (one `helm test` entry, the pod).
TEST_ROLES = ["dsv4-operator-test", "dsv4-operator-test-dry-run"]


def _named(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (found,) = [o for o in by_kind(objects, kind) if o["metadata"]["name"] == name]
    return found


def _selftest(objects: list[dict[str, Any]]) -> dict[str, Any]:
    (pod,) = [o for o in by_kind(objects, "Pod")]
    return pod


def test_helm_test_runs_the_selftest_with_rights_for_dry_runs_only_where_the_webhook_looks() -> (
    None
):
    objects = render({"watchNamespaces": ["work", "other"]}, tests=True)
    pod = _selftest(objects)
    hooks = [o for o in objects if (o["metadata"].get("annotations") or {}).get("helm.sh/hook")]
    assert [(o["kind"], o["metadata"]["annotations"]["helm.sh/hook"]) for o in hooks] == [
        ("Pod", "test")
    ]
    (container,) = pod["spec"]["containers"]
    assert container["args"] == [
        "selftest",
        "--namespace=dsv4-system",
        "--deployment=dsv4-operator",
        "--lease=dsv4-operator",
        "--target-namespace=work",
        "--engine-image=registry.example.com/dsv4-engine:0.5.16-p3",
    ]
    assert pod["spec"]["restartPolicy"] == "Never"
    # The test pod is no operator replica: no Service, PDB or Deployment selects it.
    deployment = one(objects, "Deployment")
    selectors = [deployment["spec"]["selector"]["matchLabels"]]
    selectors += [s["spec"]["selector"] for s in by_kind(objects, "Service")]
    selectors += [
        b["spec"]["selector"]["matchLabels"] for b in by_kind(objects, "PodDisruptionBudget")
    ]
    labels = pod["metadata"]["labels"].items()
    assert selectors and not [s for s in selectors if s.items() <= labels]
    # Its ServiceAccount may create DSV4Deployments (dry runs) only in the first watched
    # namespace, and read only the operator's own Deployment and Lease.
    roles = {
        (r["metadata"]["namespace"], r["metadata"]["name"]): r for r in by_kind(objects, "Role")
    }
    rules = roles["work", "dsv4-operator-test-dry-run"]["rules"]
    assert rules == [
        {"apiGroups": ["dsv4.io"], "resources": ["dsv4deployments"], "verbs": ["create"]}
    ]
    reads = roles["dsv4-system", "dsv4-operator-test"]["rules"]
    assert {n for r in reads for n in r["resourceNames"]} == {"dsv4-operator"}
    assert {v for r in reads for v in r["verbs"]} == {"get"}
    all_watched = _selftest(render(tests=True))["spec"]["containers"][0]["args"]
    assert "--target-namespace=dsv4-system" in all_watched
    assert not by_kind(render({"test": {"enabled": False}}, tests=True), "Pod")


def test_custom_resources_are_well_formed() -> None:
    objects = render(ALL_FEATURES)
    custom = {o["kind"]: o for o in objects if o["apiVersion"].startswith(CUSTOM_GROUPS)}
    assert set(custom) == {"ServiceMonitor", "PrometheusRule", "Certificate", "Issuer"}
    assert custom["ServiceMonitor"]["apiVersion"] == "monitoring.coreos.com/v1"
    assert custom["PrometheusRule"]["apiVersion"] == "monitoring.coreos.com/v1"
    assert custom["Certificate"]["apiVersion"] == "cert-manager.io/v1"
    assert custom["Issuer"]["spec"] == {"selfSigned": {}}
    for obj in custom.values():
        assert obj["metadata"]["namespace"] == "dsv4-system"
        assert obj["metadata"]["labels"]["app.kubernetes.io/instance"] == "dsv4-operator"


def test_operator_deployment_is_two_non_root_read_only_replicas_with_leader_election() -> None:
    objects = render()
    deployment = one(objects, "Deployment")
    spec = deployment["spec"]
    assert spec["replicas"] == 2
    # Never below the replica count while rolling: the webhook keeps a serving replica.
    assert spec["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1},
    }
    pod = spec["template"]["spec"]
    anti = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert anti[0]["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    assert anti[0]["podAffinityTerm"]["labelSelector"]["matchLabels"].items() <= (
        spec["template"]["metadata"]["labels"].items()
    )
    env = {e["name"]: e for e in _container(objects)["env"]}
    assert env["DSV4_LEADER_ELECTION"]["value"] == "true"
    assert env["DSV4_LEASE_NAME"]["value"] == "dsv4-operator"
    assert env["DSV4_LEASE_OWNER"]["value"] == deployment["metadata"]["name"]
    assert env["DSV4_POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert env["DSV4_LEASE_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == (
        "metadata.namespace"
    )
    budget = one(objects, "PodDisruptionBudget")["spec"]
    assert budget["maxUnavailable"] == 1
    assert (
        budget["selector"]["matchLabels"].items() <= spec["template"]["metadata"]["labels"].items()
    )
    assert not by_kind(render({"replicaCount": 1}), "PodDisruptionBudget")
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    container = _container(objects)
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert set(container["resources"]["requests"]) == {"cpu", "memory"}
    assert container["args"] == ["run"]
    # A planned stop keeps serving the webhook after the pod left the endpoints.
    assert container["lifecycle"] == {"preStop": {"sleep": {"seconds": 5}}}
    assert container["lifecycle"]["preStop"]["sleep"]["seconds"] < pod.get(
        "terminationGracePeriodSeconds", 30
    )
    unslept = _container(render({"preStopSleepSeconds": 0}))
    assert "lifecycle" not in unslept
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert container["image"] == f"registry.example.com/dsv4-operator:{chart['appVersion']}"
    # A writable /tmp on an emptyDir, since the root filesystem is read-only.
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert "emptyDir" in volumes[mounts["/tmp"]]
    assert pod["serviceAccountName"] == "dsv4-operator"
    assert _named(objects, "ServiceAccount", "dsv4-operator")


def test_probes_call_kopfs_health_endpoint_on_the_port_the_operator_serves() -> None:
    objects = render({"ports": {"metrics": 18080, "health": 18081, "webhook": 19443}})
    container, env = _container(objects), _env(objects)
    health = _port(objects, "health")
    assert health == int(env["DSV4_HEALTH_PORT"]) == 18081
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "health"}, probe
    assert _port(objects, "metrics") == int(env["DSV4_METRICS_PORT"]) == 18080
    assert _port(objects, "webhook") == int(env["DSV4_WEBHOOK_PORT"]) == 19443


def test_services_select_the_operator_pod_and_target_its_named_ports() -> None:
    objects = render()
    pod_labels = one(objects, "Deployment")["spec"]["template"]["metadata"]["labels"]
    services = {s["metadata"]["name"]: s for s in by_kind(objects, "Service")}
    assert set(services) == {"dsv4-operator-metrics", "dsv4-operator-webhook"}
    for service in services.values():
        assert service["spec"]["selector"].items() <= pod_labels.items()
    assert services["dsv4-operator-metrics"]["spec"]["ports"] == [
        {"name": "metrics", "port": 8080, "targetPort": "metrics", "protocol": "TCP"}
    ]
    assert services["dsv4-operator-webhook"]["spec"]["ports"] == [
        {"name": "webhook", "port": 443, "targetPort": "webhook", "protocol": "TCP"}
    ]


def _operator_cluster_roles(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The operator's own ClusterRoles (not those aggregated into the users' default roles)."""
    return [
        r
        for r in by_kind(objects, "ClusterRole")
        if not any(
            k.startswith("rbac.authorization.k8s.io/aggregate-to-") for k in r["metadata"]["labels"]
        )
    ]


def test_cluster_wide_rbac_is_one_cluster_role_with_the_measured_rules() -> None:
    objects = render()
    assert _env(objects)["DSV4_NAMESPACES"] == ""
    assert [r["metadata"]["name"] for r in by_kind(objects, "Role")] == [
        "dsv4-operator-leader-election",
        *TEST_ROLES,  # the `helm test` pod's (test_helm_test_runs_the_selftest_...)
    ]
    roles = {r["metadata"]["name"]: r for r in _operator_cluster_roles(objects)}
    assert roles["dsv4-operator"]["rules"] == NAMESPACED_RULES
    assert roles["dsv4-operator-discovery"]["rules"] == [CRD_RULE]
    sa = _named(objects, "ServiceAccount", "dsv4-operator")["metadata"]
    bindings = by_kind(objects, "ClusterRoleBinding")
    assert {b["roleRef"]["name"] for b in bindings} == set(roles)
    for binding in bindings:
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": sa["name"], "namespace": sa["namespace"]}
        ]


def test_namespaced_rbac_is_a_role_per_namespace_and_read_only_cluster_scope() -> None:
    objects = render({"watchNamespaces": ["llm-a", "llm-b", "llm-a"]})
    assert _env(objects)["DSV4_NAMESPACES"] == "llm-a,llm-b"
    roles = [r for r in by_kind(objects, "Role") if r["metadata"]["name"] == "dsv4-operator"]
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["llm-a", "llm-b"]
    for role in roles:
        assert role["rules"] == NAMESPACED_RULES
    bindings = [
        b for b in by_kind(objects, "RoleBinding") if b["roleRef"]["name"] == "dsv4-operator"
    ]
    assert sorted(b["metadata"]["namespace"] for b in bindings) == ["llm-a", "llm-b"]
    for binding in bindings:
        assert binding["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "Role",
            "name": "dsv4-operator",
        }
        assert binding["subjects"][0]["namespace"] == "dsv4-system"
    # Cluster scope: only kopf's read-only discovery of CRDs and namespaces.
    [cluster_role] = _operator_cluster_roles(objects)
    assert cluster_role["rules"] == [CRD_RULE, NAMESPACE_RULE]
    webhook = one(objects, "ValidatingWebhookConfiguration")["webhooks"][0]
    assert webhook["namespaceSelector"] == {
        "matchExpressions": [
            {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["llm-a", "llm-b"]}
        ]
    }


def test_rbac_can_leave_out_service_monitors_or_be_left_to_the_user() -> None:
    objects = render({"rbac": {"serviceMonitors": False}})
    rules = [r for role in _operator_cluster_roles(objects) for r in role["rules"]]
    assert rules and all("monitoring.coreos.com" not in r["apiGroups"] for r in rules)
    kinds = {o["kind"] for o in render({"rbac": {"create": False}})}
    assert not kinds & {"ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}
    assert "ServiceAccount" in kinds


def _certificate(pem: str) -> x509.Certificate:
    return x509.load_pem_x509_certificate(pem.encode())


def _verify_signed_by(cert: x509.Certificate, ca: x509.Certificate) -> None:
    key = ca.public_key()
    assert cert.signature_hash_algorithm is not None
    if isinstance(key, rsa.RSAPublicKey):
        key.verify(
            cert.signature,
            cert.tbs_certificate_bytes,
            padding.PKCS1v15(),
            cert.signature_hash_algorithm,
        )
    else:
        assert isinstance(key, ec.EllipticCurvePublicKey)
        key.verify(
            cert.signature, cert.tbs_certificate_bytes, ec.ECDSA(cert.signature_hash_algorithm)
        )


def test_helm_generated_certificate_serves_the_webhook_service_name() -> None:
    objects = render(namespace="ops")
    secret = one(objects, "Secret")
    data = {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}
    assert secret["type"] == "kubernetes.io/tls"
    ca, leaf = _certificate(data["ca.crt"]), _certificate(data["tls.crt"])
    _verify_signed_by(leaf, ca)
    webhook = one(objects, "ValidatingWebhookConfiguration")["webhooks"][0]
    assert base64.b64decode(webhook["clientConfig"]["caBundle"]).decode() == data["ca.crt"]
    service = webhook["clientConfig"]["service"]
    assert service == {
        "name": "dsv4-operator-webhook",
        "namespace": "ops",
        "port": 443,
        "path": "/rules",
    }
    names = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "dsv4-operator-webhook.ops.svc" in names.get_values_for_type(x509.DNSName)
    now = datetime.datetime.now(datetime.UTC)
    assert leaf.not_valid_before_utc <= now < leaf.not_valid_after_utc
    # The private key belongs to the certificate.
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    key = load_pem_private_key(data["tls.key"].encode(), password=None)
    assert key.public_key().public_numbers() == leaf.public_key().public_numbers()  # type: ignore[union-attr]
    # ... and it is what the operator reads from DSV4_WEBHOOK_CERT_DIR.
    pod = one(objects, "Deployment")["spec"]["template"]["spec"]
    mount = next(m for m in _container(objects)["volumeMounts"] if m["name"] == "webhook-tls")
    assert mount["mountPath"] == _env(objects)["DSV4_WEBHOOK_CERT_DIR"]
    volume = next(v for v in pod["volumes"] if v["name"] == "webhook-tls")
    assert volume["secret"]["secretName"] == secret["metadata"]["name"]
    assert {i["path"] for i in volume["secret"]["items"]} == {"tls.crt", "tls.key"}


def test_cert_manager_certificate_feeds_the_same_secret_and_injects_the_ca() -> None:
    objects = render({"webhook": {"certificate": {"source": "certManager"}}})
    assert not by_kind(objects, "Secret")
    certificate = one(objects, "Certificate")
    issuer = one(objects, "Issuer")
    assert certificate["spec"]["issuerRef"] == {
        "name": issuer["metadata"]["name"],
        "kind": "Issuer",
        "group": "cert-manager.io",
    }
    assert "dsv4-operator-webhook.dsv4-system.svc" in certificate["spec"]["dnsNames"]
    config = one(objects, "ValidatingWebhookConfiguration")
    assert config["metadata"]["annotations"] == {
        "cert-manager.io/inject-ca-from": f"dsv4-system/{certificate['metadata']['name']}"
    }
    assert "caBundle" not in config["webhooks"][0]["clientConfig"]
    pod = one(objects, "Deployment")["spec"]["template"]["spec"]
    volume = next(v for v in pod["volumes"] if v["name"] == "webhook-tls")
    assert volume["secret"]["secretName"] == certificate["spec"]["secretName"]
    # A given issuer is used as is, and no Issuer is created.
    given = render(VALUE_SETS["cert-manager-issuer"])
    assert not by_kind(given, "Issuer")
    assert one(given, "Certificate")["spec"]["issuerRef"] == {
        "name": "corp-ca",
        "kind": "ClusterIssuer",
    }


def test_webhook_off_leaves_no_webhook_objects_and_tells_the_operator() -> None:
    objects = render({"webhook": {"enabled": False}})
    kinds = {o["kind"] for o in objects}
    assert not kinds & {"ValidatingWebhookConfiguration", "Secret", "Certificate", "Issuer"}
    assert [s["metadata"]["name"] for s in by_kind(objects, "Service")] == ["dsv4-operator-metrics"]
    env = _env(objects)
    assert env["DSV4_WEBHOOK"] == "false"
    assert "DSV4_WEBHOOK_CERT_DIR" not in env
    assert "webhook" not in {p["name"] for p in _container(objects)["ports"]}


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"webhook": {"certificate": {"source": "vault"}}}, "/webhook/certificate/source"),
        ({"watchNamespaces": "llm-a"}, "/watchNamespaces"),
        ({"watchNamespaces": ["Not_A_Namespace"]}, "/watchNamespaces/0"),
        ({"operator": {"logFormat": "xml"}}, "/operator/logFormat"),
        ({"replicaCount": 0}, "/replicaCount"),
        ({"webhook": {"timeoutSeconds": 31}}, "/webhook/timeoutSeconds"),
        ({"ports": {"health": 0}}, "/ports/health"),
        ({"image": {"digest": "latest"}}, "/image/digest"),
        ({"guard": {"allowedCanaryEndpoints": ["canary.llm:9000"]}}, "allowedCanaryEndpoints/0"),
        ({"guard": {"allowedCanaryEndpoints": ["http://a,b"]}}, "allowedCanaryEndpoints/0"),
        ({"guard": {"minCanaryInterval": "soon"}}, "/guard/minCanaryInterval"),
        ({"guard": {"canariesAtOnce": 0}}, "/guard/canariesAtOnce"),
        ({"guard": {"idleReadSeconds": 0.5}}, "/guard/idleReadSeconds"),
        ({"guard": {"readsAtOnce": 0}}, "/guard/readsAtOnce"),
        ({"operator": {"retryBackoffMaxSeconds": 0}}, "/operator/retryBackoffMaxSeconds"),
        ({"security": {"hostPathPrefixes": ["relative/path"]}}, "/security/hostPathPrefixes/0"),
        (
            {"prometheusRule": {"runbookBaseUrl": "docs/runbook.md"}},
            "/prometheusRule/runbookBaseUrl",
        ),
    ],
)
def test_values_schema_rejects_bad_values(values: dict[str, Any], message: str) -> None:
    proc = run(
        [tool("helm"), "template", "x", CHART, *helm_args(values)],
        check=False,
    )
    assert proc.returncode != 0
    assert "values don't meet the specifications of the schema" in proc.stderr
    assert message in proc.stderr


def _alerts(rule: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"] if "alert" in r}


def test_prometheus_rule_embeds_the_plain_rules_file() -> None:
    plain = {
        r["alert"]: r for g in yaml.safe_load(RULES_FILE.read_text())["groups"] for r in g["rules"]
    }
    base = "https://docs.example.com/dsv4/runbook.md"
    scraped = _alerts(
        one(
            render(
                {
                    "prometheusRule": {"enabled": True, "runbookBaseUrl": base},
                    "metrics": {"serviceMonitor": {"enabled": True}},
                }
            ),
            "PrometheusRule",
        )
    )
    assert set(scraped) == set(plain)
    for name, rule in scraped.items():
        assert rule["annotations"].pop("runbook_url") == f"{base}#{name.lower()}"
        assert rule["annotations"] == {
            k: v for k, v in plain[name]["annotations"].items() if k != "runbook_url"
        }
        assert {k: v for k, v in rule.items() if k != "annotations"} == {
            k: v for k, v in plain[name].items() if k != "annotations"
        }
    assert not by_kind(render(), "PrometheusRule")


def test_operator_down_is_shipped_only_when_something_scrapes_the_operator() -> None:
    # prometheusRule alone (the ServiceMonitor is off by default): nothing scrapes job
    # dsv4-operator, so absent(up) would page on a healthy operator.
    alone = _alerts(one(render({"prometheusRule": {"enabled": True}}), "PrometheusRule"))
    assert "DSV4OperatorDown" not in alone and "DSV4LeakRateHigh" in alone
    # No runbookBaseUrl: no relative runbook_url that resolves nowhere.
    assert not [a for a in alone.values() if "runbook_url" in a["annotations"]]
    elsewhere = render({"prometheusRule": {"enabled": True, "operatorScrapedElsewhere": True}})
    assert "DSV4OperatorDown" in _alerts(one(elsewhere, "PrometheusRule"))
    assert not by_kind(elsewhere, "ServiceMonitor")


def test_dashboard_config_map_carries_the_dashboard_for_the_sidecar() -> None:
    config_map = one(render(), "ConfigMap")
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert config_map["data"] == {"dsv4-operator.json": DASHBOARD_FILE.read_text().rstrip("\n")}
    elsewhere = one(
        render({"grafanaDashboard": {"namespace": "monitoring", "labels": {"dash": "yes"}}}),
        "ConfigMap",
    )
    assert elsewhere["metadata"]["namespace"] == "monitoring"
    assert elsewhere["metadata"]["labels"]["dash"] == "yes"


def test_service_monitor_scrapes_as_the_job_the_operator_down_alert_watches() -> None:
    objects = render({"metrics": {"serviceMonitor": {"enabled": True}}})
    monitor = one(objects, "ServiceMonitor")
    metrics = next(
        s for s in by_kind(objects, "Service") if s["metadata"]["name"].endswith("-metrics")
    )
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= metrics["metadata"]["labels"].items()
    job = metrics["metadata"]["labels"][monitor["spec"]["jobLabel"]]
    assert job == "dsv4-operator"
    alert = next(
        r
        for g in yaml.safe_load(RULES_FILE.read_text())["groups"]
        for r in g["rules"]
        if r["alert"] == "DSV4OperatorDown"
    )
    assert f'job="{job}"' in alert["expr"]
    assert monitor["spec"]["endpoints"][0]["port"] == "metrics"


def test_service_monitor_keeps_the_namespace_the_operator_labels_its_series_with() -> None:
    """The operator runs in its own namespace: without honorLabels, prometheus-operator's
    `namespace` target label would replace each DSV4Deployment's (moved to
    exported_namespace), and no series of the operator would join the taps' or engines'."""
    monitor = one(render({"metrics": {"serviceMonitor": {"enabled": True}}}), "ServiceMonitor")
    assert monitor["spec"]["endpoints"][0]["honorLabels"] is True


@pytest.mark.parametrize("values", VALUE_SETS.values(), ids=VALUE_SETS.keys())
def test_operator_settings_accept_the_environment_the_chart_sets(values: dict[str, Any]) -> None:
    from dsv4_operator.settings import OperatorSettings

    objects = render(values)
    env = _env(objects)
    fields = {f"DSV4_{name.upper()}" for name in OperatorSettings.model_fields}
    assert set(env) <= fields, f"unknown settings {set(env) - fields}"
    settings = _operator_settings(env)
    assert settings.namespace_list == values.get("watchNamespaces", [])
    assert settings.webhook is values.get("webhook", {}).get("enabled", True)
    assert settings.health_port == _port(objects, "health")
    assert settings.webhook_url_host is None, "in-cluster, the chart owns the webhook config"
    if settings.webhook:
        assert str(settings.webhook_cert_dir) == next(
            m["mountPath"]
            for m in _container(objects)["volumeMounts"]
            if m["name"] == "webhook-tls"
        )


def test_queue_and_guard_values_reach_the_operator_settings() -> None:
    from dsv4_operator.settings import OperatorSettings

    def settings(values: dict[str, Any]) -> OperatorSettings:
        return _operator_settings(_env(render(values)))

    fields = (
        "retry_backoff_max_seconds",
        "guard_canaries_at_once",
        "guard_idle_read_seconds",
        "guard_reads_at_once",
    )
    defaults = settings({})
    assert tuple(getattr(defaults, f) for f in fields) == tuple(
        OperatorSettings.model_fields[f].default for f in fields
    ), "the chart's defaults are the operator's"
    tuned = settings(
        {
            "operator": {"retryBackoffMaxSeconds": 60},
            "guard": {"canariesAtOnce": 4, "idleReadSeconds": 30, "readsAtOnce": 8},
        }
    )
    assert tuple(getattr(tuned, f) for f in fields) == (60.0, 4, 30.0, 8)


def test_trust_values_reach_the_operator_policy() -> None:
    from dsv4_operator.trust import TrustPolicy

    defaults = _env(render({}))
    policy = _operator_settings(defaults).trust_policy
    assert policy == TrustPolicy(), "the chart's defaults are the safest policy"
    env = _env(
        render(
            {
                "clusterDomain": "corp.internal",
                "guard": {
                    "allowedCanaryEndpoints": ["http://canary.llm:9000", "https://c.example/v1"],
                    "minCanaryInterval": "30s",
                    "prometheus": {
                        "url": "http://prometheus.monitoring.svc:9090",
                        "allowedUrls": ["http://thanos.monitoring.svc:9090"],
                    },
                },
                "security": {"hostPathPrefixes": ["/mnt/models", "/data/hf"]},
            }
        )
    )
    policy = _operator_settings(env).trust_policy
    assert policy == TrustPolicy(
        canary_endpoints=("http://canary.llm:9000", "https://c.example/v1"),
        prometheus_url="http://prometheus.monitoring.svc:9090",
        prometheus_urls=("http://thanos.monitoring.svc:9090",),
        host_path_prefixes=("/mnt/models", "/data/hf"),
        cluster_domain="corp.internal",
        min_canary_interval="30s",
    )


def test_extra_env_refuses_exactly_the_variables_the_chart_sets() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    refused = set(schema["properties"]["extraEnv"]["items"]["properties"]["name"]["not"]["enum"])
    template = (CHART / "templates" / "deployment.yaml").read_text()
    assert refused == set(re.findall(r"- name: (DSV4_\w+)", template))
    rendered = {k for k in _env(render(ALL_FEATURES)) if k.startswith("DSV4_")}
    assert rendered <= refused
    extra = _env(render({"extraEnv": [{"name": "DSV4_DEBUG_X", "value": "1"}]}))
    assert extra["DSV4_DEBUG_X"] == "1"


def test_users_rights_are_aggregated_into_the_default_roles() -> None:
    roles = {r["metadata"]["name"]: r for r in by_kind(render(), "ClusterRole")}
    view, edit = roles["dsv4-operator-view"], roles["dsv4-operator-edit"]
    aggregate = "rbac.authorization.k8s.io/aggregate-to-"
    assert {k for k, v in view["metadata"]["labels"].items() if v == "true"} >= {
        f"{aggregate}view",
        f"{aggregate}edit",
        f"{aggregate}admin",
    }
    assert f"{aggregate}view" not in edit["metadata"]["labels"]
    assert view["rules"] == [
        {
            "apiGroups": ["dsv4.io"],
            "resources": [
                "dsv4deployments",
                "dsv4deployments/status",
                "dsv4models",
                "dsv4models/status",
            ],
            "verbs": ["get", "list", "watch"],
        }
    ]
    # Users never write the status: it belongs to the operator.
    for status in ("dsv4deployments/status", "dsv4models/status"):
        assert all(status not in r["resources"] for r in edit["rules"])
    assert any("dsv4models" in r["resources"] and "delete" in r["verbs"] for r in edit["rules"])
    off = by_kind(render({"rbac": {"aggregateToDefaultRoles": False}}), "ClusterRole")
    assert not {r["metadata"]["name"] for r in off} & {"dsv4-operator-view", "dsv4-operator-edit"}


def test_leader_election_role_is_narrowed_to_the_release_lease() -> None:
    objects = render()
    role = _named(objects, "Role", "dsv4-operator-leader-election")
    assert role["metadata"] == {
        **role["metadata"],
        "name": "dsv4-operator-leader-election",
        "namespace": "dsv4-system",
    }
    assert role["rules"] == [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "resourceNames": ["dsv4-operator"],
            "verbs": ["get", "update"],
        },
        # The Lease's owner (DSV4_LEASE_OWNER): uninstalling deletes the Lease with it.
        {
            "apiGroups": ["apps"],
            "resources": ["deployments"],
            "resourceNames": ["dsv4-operator"],
            "verbs": ["get"],
        },
    ]
    binding = _named(objects, "RoleBinding", "dsv4-operator-leader-election")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
