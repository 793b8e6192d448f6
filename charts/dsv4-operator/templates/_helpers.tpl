{{/* Names, labels and the settings several templates share. */}}

{{- define "dsv4-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "dsv4-operator.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "dsv4-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "dsv4-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "dsv4-operator.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "dsv4-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: dsv4-operator
{{- end -}}

{{- define "dsv4-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "dsv4-operator.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "dsv4-operator.image" -}}
{{- $tag := default .Chart.AppVersion .Values.image.tag -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository $tag -}}
{{- end -}}
{{- end -}}

{{/* Namespaces the operator watches, in order, without duplicates; empty means all. */}}
{{- define "dsv4-operator.watchNamespaces" -}}
{{- .Values.watchNamespaces | uniq | join "," -}}
{{- end -}}

{{- define "dsv4-operator.webhookServiceName" -}}
{{- printf "%s-webhook" (include "dsv4-operator.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "dsv4-operator.webhookSecretName" -}}
{{- printf "%s-webhook-tls" (include "dsv4-operator.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "dsv4-operator.metricsServiceName" -}}
{{- printf "%s-metrics" (include "dsv4-operator.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* DNS names the webhook serving certificate must carry (the API server dials the first). */}}
{{- define "dsv4-operator.webhookDNSNames" -}}
{{- $svc := include "dsv4-operator.webhookServiceName" . -}}
{{- list (printf "%s.%s.svc" $svc .Release.Namespace) (printf "%s.%s.svc.%s" $svc .Release.Namespace .Values.clusterDomain) (printf "%s.%s" $svc .Release.Namespace) $svc | toJson -}}
{{- end -}}

{{/* Directory inside the container where the webhook's tls.crt and tls.key are mounted. */}}
{{- define "dsv4-operator.webhookCertDir" -}}
/etc/dsv4-operator/webhook-tls
{{- end -}}

{{/*
Fail, saying what to install, when a value asks for a prometheus-operator kind the cluster does
not serve (Helm's own error names neither the value nor the missing CRD). Called with
(list KIND VALUE ALTERNATIVE .). Only when Helm discovered the cluster's APIs: every
kube-apiserver serves apiregistration.k8s.io/v1, which Helm's offline set (`helm template`,
`helm lint`, no `--api-versions`) lacks, so an offline render cannot know and does not fail.
*/}}
{{- define "dsv4-operator.requireMonitoringKind" -}}
{{- $kind := index . 0 }}
{{- $value := index . 1 }}
{{- $alternative := index . 2 }}
{{- $root := index . 3 }}
{{- $discovered := $root.Capabilities.APIVersions.Has "apiregistration.k8s.io/v1" }}
{{- if and $discovered (not ($root.Capabilities.APIVersions.Has (printf "monitoring.coreos.com/v1/%s" $kind))) }}
{{- fail (printf "%s=true needs the %s kind of prometheus-operator (monitoring.coreos.com/v1), which this cluster does not serve: install prometheus-operator and its CRDs first (for example the kube-prometheus-stack chart, or prometheus-operator-crds alone), or set %s=false and %s. With helm template --api-versions, list monitoring.coreos.com/v1/%s." $value $kind $value $alternative $kind) }}
{{- end }}
{{- end }}

{{/*
The PriorityClass of culprit-search shadow pairs: guard.bisect.priorityClass.name, else one per
release (<fullname>-bisect), so two releases in one cluster never claim the same
cluster-scoped object.
*/}}
{{- define "dsv4-operator.bisectPriorityClass" -}}
{{- default (printf "%s-bisect" (include "dsv4-operator.fullname" .)) .Values.guard.bisect.priorityClass.name | trunc 253 -}}
{{- end -}}
