"""Puts a component's `PodSettings` (spec.podTemplate, role on top) into a rendered pod
template, after what the operator owns: its labels, volumes, env and security defaults win
or come first."""

from __future__ import annotations

import copy

from dsv4_operator.api.pod import PodSettings
from dsv4_operator.render.context import Manifest


def with_pod_settings(template: Manifest, settings: PodSettings) -> Manifest:
    """`template` (a pod template the caller has just built, its first container the main
    one) with `settings` added in place, and returned; unchanged when the settings are empty.
    What comes from the settings is copied: manifests must not share the spec's objects."""
    meta, spec = template["metadata"], template["spec"]
    main = spec["containers"][0]
    if settings.labels:
        meta["labels"] = {**settings.labels, **meta["labels"]}
    if settings.annotations:
        meta["annotations"] = {**settings.annotations, **meta.get("annotations", {})}
    if settings.image_pull_secrets:
        spec["imagePullSecrets"] = [s.to_wire() for s in settings.image_pull_secrets]
    for field, value in (
        ("serviceAccountName", settings.service_account_name),
        ("priorityClassName", settings.priority_class_name),
        ("affinity", settings.affinity),
    ):
        if value:
            spec[field] = copy.deepcopy(value)
    if settings.topology_spread_constraints:
        spec["topologySpreadConstraints"] = copy.deepcopy(settings.topology_spread_constraints)
    if settings.tolerations:
        spec["tolerations"] = [
            *spec.get("tolerations", []),
            *(t.to_wire() for t in settings.tolerations),
        ]
    if settings.security_context:
        spec["securityContext"] = {**spec.get("securityContext", {}), **settings.security_context}
    if settings.volumes:
        spec["volumes"] = [*spec.get("volumes", []), *copy.deepcopy(settings.volumes)]
    if settings.volume_mounts:
        main["volumeMounts"] = [
            *main.get("volumeMounts", []),
            *(m.to_wire() for m in settings.volume_mounts),
        ]
    if settings.env:
        main["env"] = [
            *main.get("env", []),
            *(e.to_wire() for e in settings.env),
        ]
    return template
