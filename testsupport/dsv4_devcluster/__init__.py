"""A real, throwaway Kubernetes control plane on loopback, for integration tests and demos.

It runs the genuine binaries (built from the Kubernetes Go modules by ``tools/build-k8s.sh``,
or taken from ``$KUBEBUILDER_ASSETS``): etcd, kube-apiserver, kube-controller-manager and,
optionally, kube-scheduler plus kwok for fake GPU nodes and the LeaderWorkerSet controller
(``with_lws=True``). No mock API server is involved.

Public API::

    from dsv4_devcluster import ControlPlane

    with ControlPlane(with_scheduler=True, with_kwok=True) as cp:
        cp.kubeconfig_path          # admin kubeconfig (Path)
        cp.server_url               # "https://127.0.0.1:<port>"
        cp.api_client()             # kubernetes.client.ApiClient
        cp.dynamic_client()         # kubernetes.dynamic.DynamicClient
        cp.add_gpu_node("gpu-a", gpus=8, product="NVIDIA-H100-80GB-HBM3")

    report_container_terminated(dyn, ns, pod, container)   # kubelet-style OOMKilled report
    report_pod_exited(dyn, ns, pod, container, exit_code)  # a Job's pod ended
    wait_for("what", lambda: value_or_none(), timeout=60)    # poll; returns the truthy value

Modules: :mod:`.binaries` (find/build the executables), :mod:`.pki` (certificates and keys),
:mod:`.process` (child processes, teardown), :mod:`.controlplane` (start/stop order, flags),
:mod:`.lws` (the LeaderWorkerSet controller, its CRDs and webhooks), :mod:`.nodes` (fake GPU
Node objects), :mod:`.kubelet` (pod status reports),
:mod:`.prober` (pod addresses on ``lo`` and the kubelet's readiness probe, for pods whose
process runs here),
:mod:`.hub` (a stand-in for the Hugging Face Hub's download API),
:mod:`.operator` (the operator, ``dsv4 run``, as a child process: the one launcher of the demo,
the benchmarks and the tests), :mod:`.deployments` (the example DSV4Deployment on a GPU test
pool, its weights volume, and access to it and its children), :mod:`.fleet` (many guarded
deployments whose pods a few engine doubles and leak taps answer for: bench/scale.py),
``python -m dsv4_devcluster`` (run one locally until Ctrl-C).
"""

from dsv4_devcluster.binaries import (
    K8S_VERSION,
    Binaries,
    BinariesUnavailable,
    locate,
)
from dsv4_devcluster.controlplane import ControlPlane, DevClusterError
from dsv4_devcluster.kubelet import (
    MANUAL_STATUS_ANNOTATION,
    report_container_terminated,
    report_container_waiting,
    report_pod_exited,
    report_pod_ip,
    wait_pod_running,
)
from dsv4_devcluster.nodes import GPU_PRODUCT_LABEL, GPU_RESOURCE, gpu_node_manifest
from dsv4_devcluster.process import wait_for

__all__ = [
    "GPU_PRODUCT_LABEL",
    "GPU_RESOURCE",
    "K8S_VERSION",
    "MANUAL_STATUS_ANNOTATION",
    "Binaries",
    "BinariesUnavailable",
    "ControlPlane",
    "DevClusterError",
    "gpu_node_manifest",
    "locate",
    "report_container_terminated",
    "report_container_waiting",
    "report_pod_exited",
    "report_pod_ip",
    "wait_for",
    "wait_pod_running",
]
