{{/* Names, labels and the RBAC rules shared by the templates. */}}

{{- define "snooze.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
RELEASE-snooze, or the release name alone when it already contains the chart name, or
fullnameOverride. Every object's name is this plus at most "-operator-metrics" (17
characters), and a Service name may have 63: so it has at most 46. A longer one keeps its
first 32 characters, then a hash of the whole (two releases whose names share a long prefix
still get different names), then "-snooze" (the alerts find their jobs by it,
rules/snooze.rules.yaml).
*/}}
{{- define "snooze.fullname" -}}
{{- $full := "" }}
{{- if .Values.fullnameOverride }}
{{- $full = .Values.fullnameOverride }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- $full = .Release.Name }}
{{- else }}
{{- $full = printf "%s-%s" .Release.Name $name }}
{{- end }}
{{- end }}
{{- if le (len $full) 46 }}
{{- $full | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s-%s" ($full | trunc 32 | trimSuffix "-") (sha256sum $full | trunc 6) .Chart.Name }}
{{- end }}
{{- end }}

{{/* The name of a cluster-scoped object (ClusterRole, ClusterRoleBinding), which releases in
different namespaces share one space of names for: it carries the release's namespace.
Call with (dict "ctx" $ "suffix" "operator"|"gateway"). Hashed when over 63 characters. */}}
{{- define "snooze.clusterScopedName" -}}
{{- $full := printf "%s-%s-%s" .ctx.Release.Namespace (include "snooze.fullname" .ctx) .suffix }}
{{- if le (len $full) 63 }}
{{- $full }}
{{- else }}
{{- printf "%s-%s" ($full | trunc 54 | trimSuffix "-") (sha256sum $full | trunc 8) }}
{{- end }}
{{- end }}

{{- define "snooze.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels of every object; call with (dict "ctx" $ "component" "operator"|"gateway"). */}}
{{- define "snooze.labels" -}}
helm.sh/chart: {{ include "snooze.chart" .ctx }}
{{ include "snooze.selectorLabels" . }}
app.kubernetes.io/version: {{ .ctx.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .ctx.Release.Service }}
app.kubernetes.io/part-of: snooze
{{- end }}

{{/* The labels that select one component's pods; they never change after install. */}}
{{- define "snooze.selectorLabels" -}}
app.kubernetes.io/name: {{ include "snooze.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
{{- if .component }}
app.kubernetes.io/component: {{ .component }}
{{- end }}
{{- end }}

{{- define "snooze.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{- define "snooze.operator.serviceAccountName" -}}
{{- if .Values.operator.serviceAccount.create }}
{{- default (printf "%s-operator" (include "snooze.fullname" .)) .Values.operator.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.operator.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "snooze.gateway.serviceAccountName" -}}
{{- if .Values.gateway.serviceAccount.create }}
{{- default (printf "%s-gateway" (include "snooze.fullname" .)) .Values.gateway.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.gateway.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* "true" when kopf peering is on: asked for, or implied by more than one operator replica. */}}
{{- define "snooze.peering" -}}
{{- if or .Values.operator.peering.enabled (gt (int .Values.operator.replicas) 1) }}true{{ end }}
{{- end }}

{{/*
RBAC rules. Each list below is exactly one tuple of operator/snooze/api/rbac.py, one rule per
Permission, its comment the Permission's `why` (tests/chart/test_rbac.py checks both ways).
Plain YAML only inside these blocks: no template actions, no wildcards.
*/}}

{{- define "snooze.rules.operator" -}}
# watch InferenceModels; kopf patches its finalizer and progress annotations
- apiGroups: ["snooze.dev"]
  resources: ["inferencemodels"]
  verbs: ["get", "list", "watch", "patch"]
# report phase, engines, wakes and conditions on the status subresource
- apiGroups: ["snooze.dev"]
  resources: ["inferencemodels/status"]
  verbs: ["get", "patch"]
# watch GPUPools, whose members share one device; kopf patches its marks on them
- apiGroups: ["snooze.dev"]
  resources: ["gpupools"]
  verbs: ["get", "list", "watch", "patch"]
# report a pool's memory, members, waiting wakes and evictions on its status
- apiGroups: ["snooze.dev"]
  resources: ["gpupools/status"]
  verbs: ["get", "patch"]
# find each model's pods, publish their snooze.dev/state label, and delete a pod whose engine
# cannot wake (wake.onFailure: Restart)
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch", "patch", "delete"]
# write the snooze.dev/awake condition of pods that list it as a readiness gate, so that a
# sleeping engine leaves every Service and InferencePool
- apiGroups: [""]
  resources: ["pods/status"]
  verbs: ["patch"]
# post an Event for each sleep, wake and failure; count its repeats on it
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create", "patch"]
# read a model's scaleTargetRef Deployment: its replicas, and its pod template, which the
# model's selector must select before Snooze scales it
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["get"]
# read a model's scaleTargetRef StatefulSet: its replicas, and its pod template, which the
# model's selector must select before Snooze scales it
- apiGroups: ["apps"]
  resources: ["statefulsets"]
  verbs: ["get"]
# scale a model's Deployment to zero after scaleToZeroAfter, and back on demand
- apiGroups: ["apps"]
  resources: ["deployments/scale"]
  verbs: ["patch"]
# scale a model's StatefulSet to zero after scaleToZeroAfter, and back on demand
- apiGroups: ["apps"]
  resources: ["statefulsets/scale"]
  verbs: ["patch"]
{{- end }}

{{- define "snooze.rules.gateway" -}}
# know every model (also sleeping ones) by its modelName, and ask for a wake by merge-patching
# the snooze.dev/wake-requested-at annotation
- apiGroups: ["snooze.dev"]
  resources: ["inferencemodels"]
  verbs: ["list", "watch", "patch"]
# follow each model's pods, their snooze.dev/state label and address, to route only to awake
# ones
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list", "watch"]
{{- end }}

{{- define "snooze.rules.gatewayDiscovery" -}}
# find the gateway's replicas behind its metrics Service, to read their per-engine counters
# instead of probing engines whose requests all pass through the gateway
- apiGroups: ["discovery.k8s.io"]
  resources: ["endpointslices"]
  verbs: ["list"]
{{- end }}

{{- define "snooze.rules.inferenceGateway" -}}
# find the InferencePools whose selector selects a model's pods, and the endpoint picker each
# names
- apiGroups: ["inference.networking.k8s.io"]
  resources: ["inferencepools"]
  verbs: ["list"]
# read the Service that an InferencePool's endpointPickerRef names
- apiGroups: [""]
  resources: ["services"]
  verbs: ["get"]
# find the ready replicas of each endpoint picker behind its Service, to read the requests
# queued there
- apiGroups: ["discovery.k8s.io"]
  resources: ["endpointslices"]
  verbs: ["list"]
{{- end }}

{{- define "snooze.rules.pickerMetrics" -}}
# read the endpoint pickers' metrics, which check this token's right to get /metrics
- nonResourceURLs: ["/metrics"]
  verbs: ["get"]
{{- end }}

{{- define "snooze.pickerReaderName" -}}
{{- printf "%s-picker" (include "snooze.fullname" .) }}
{{- end }}

{{- define "snooze.rules.peering.cluster" -}}
# kopf peering, cluster-wide: see the other operator replicas and keep this one's entry alive,
# so that only the highest-priority replica acts
- apiGroups: ["kopf.dev"]
  resources: ["clusterkopfpeerings"]
  verbs: ["list", "watch", "patch"]
{{- end }}

{{- define "snooze.rules.peering.namespaced" -}}
# kopf peering, per watched namespace: see the other operator replicas and keep this one's
# entry alive, so that only the highest-priority replica acts
- apiGroups: ["kopf.dev"]
  resources: ["kopfpeerings"]
  verbs: ["list", "watch", "patch"]
{{- end }}

{{- define "snooze.peeringName" -}}
{{- default (include "snooze.fullname" .) .Values.operator.peering.name }}
{{- end }}

{{/* A NetworkPolicyPeer for one component's pods of this release, in its namespace; call with
(dict "ctx" $ "component" "operator"|"gateway"). */}}
{{- define "snooze.releasePeer" -}}
- namespaceSelector:
    matchLabels:
      kubernetes.io/metadata.name: {{ .ctx.Release.Namespace }}
  podSelector:
    matchLabels:
      {{- include "snooze.selectorLabels" . | nindent 6 }}
{{- end }}

{{/* The NetworkPolicyPeer of the Prometheus that scrapes (networkPolicy.scraper), or nothing
when none is named. A podSelector alone would select pods in each policy's own namespace,
where no Prometheus runs: a namespace is required. Its pods default to prometheus-operator's
label in the template, not in values.yaml, where Helm would merge it into a user's own
selector. */}}
{{- define "snooze.scraperPeer" -}}
{{- $scraper := .Values.networkPolicy.scraper }}
{{- if and $scraper.namespace $scraper.namespaceSelector }}
{{- fail "networkPolicy.scraper: give namespace or namespaceSelector, not both" }}
{{- end }}
{{- if or $scraper.namespace $scraper.namespaceSelector }}
- namespaceSelector:
    {{- if $scraper.namespace }}
    matchLabels:
      kubernetes.io/metadata.name: {{ $scraper.namespace }}
    {{- else }}
    {{- toYaml $scraper.namespaceSelector | nindent 4 }}
    {{- end }}
  podSelector:
    {{- toYaml ($scraper.podSelector | default (dict "matchLabels" (dict "app.kubernetes.io/name" "prometheus"))) | nindent 4 }}
{{- end }}
{{- end }}

{{/* "true" when the cluster serves this monitoring kind (prometheus-operator's CRDs), else
nothing: without them the API server would refuse the whole install, with a message that does
not say which value asked for them; the object is left out and NOTES.txt says why. `helm
template` knows no cluster: it is told with --api-versions. */}}
{{- define "snooze.monitoringAPI" -}}
{{- if .ctx.Capabilities.APIVersions.Has (printf "monitoring.coreos.com/v1/%s" .kind) }}true{{ end }}
{{- end }}
