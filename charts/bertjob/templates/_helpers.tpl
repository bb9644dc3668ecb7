{{/*
Names. "bertjob.name" is the application's name (nameOverride, else the chart's): the
app.kubernetes.io/name label, and part of the prefix. The prefix of every object name is
fullnameOverride, else "<release>-<name>" (or the release name alone when it already says the
name), cut so that "<prefix>-operator-metrics" stays within the 63 characters of a DNS label.
Fixed names stay fixed: the CRD's, and the ClusterTrainingRuntimes' that the operator names.
*/}}
{{- define "bertjob.name" -}}
{{- .Values.nameOverride | default .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end }}

{{- define "bertjob.fullname" -}}
{{- $name := include "bertjob.name" . -}}
{{- if .Values.fullnameOverride -}}
{{- $name = .Values.fullnameOverride -}}
{{- else -}}
{{- $name = ternary .Release.Name (printf "%s-%s" .Release.Name $name) (contains $name .Release.Name) -}}
{{- end -}}
{{- $name | trunc 46 | trimSuffix "-" -}}
{{- end }}

{{- define "bertjob.operatorName" -}}
{{- printf "%s-operator" (include "bertjob.fullname" .) -}}
{{- end }}

{{/* The admission webhook's Service, and the Secret of its serving certificate. */}}
{{- define "bertjob.webhookService" -}}
{{- printf "%s-webhook" (include "bertjob.operatorName" .) -}}
{{- end }}

{{- define "bertjob.webhookSecret" -}}
{{- printf "%s-webhook-tls" (include "bertjob.operatorName" .) -}}
{{- end }}

{{/* The progress endpoint's Service, and the Secret where the operator keeps its certificate. */}}
{{- define "bertjob.progressService" -}}
{{- printf "%s-progress" (include "bertjob.operatorName" .) -}}
{{- end }}

{{- define "bertjob.progressSecret" -}}
{{- printf "%s-progress-tls" (include "bertjob.operatorName" .) -}}
{{- end }}

{{- define "bertjob.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- .Values.serviceAccount.name | default (include "bertjob.operatorName" .) -}}
{{- else -}}
{{- required "serviceAccount.name: name the existing service account when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end }}

{{/*
Labels. "name" is the application's, as on the BertPretrainJobs' own children; "instance" tells
releases apart, and "component" the operator from the objects it creates for jobs.
*/}}
{{- define "bertjob.selectorLabels" -}}
app.kubernetes.io/name: {{ include "bertjob.name" . }}
app.kubernetes.io/instance: {{ .Release.Name | quote }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "bertjob.ownLabels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | quote }}
app.kubernetes.io/name: {{ include "bertjob.name" . }}
app.kubernetes.io/instance: {{ .Release.Name | quote }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service | quote }}
{{- end }}

{{/*
Every object's labels: the chart's, then commonLabels (values.schema.json refuses a common label
that the chart sets itself, or that one of its objects adds, such as RBAC's aggregate-to-*).
*/}}
{{- define "bertjob.labels" -}}
{{ include "bertjob.ownLabels" . }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "bertjob.operatorOwnLabels" -}}
{{ include "bertjob.ownLabels" . }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "bertjob.operatorLabels" -}}
{{ include "bertjob.operatorOwnLabels" . }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/*
The operator image: registry/repository (global.imageRegistry in place of image.registry), then @digest when one is given (it pins the image, so
the tag would only mislead), else :tag, which defaults to the chart's appVersion.
*/}}
{{- define "bertjob.image" -}}
{{- $image := .Values.image.repository -}}
{{- with (.Values.global.imageRegistry | default .Values.image.registry) }}{{ $image = printf "%s/%s" . $image }}{{ end -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" $image .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" $image (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}
{{- end }}

{{/*
RBAC: the calls the operator makes, verb for verb (tests/bertjob/test_rbac_e2e.py compares these
rules with the requests the operator makes against an API emulator, in both scopes).

Cluster-scoped in either scope: kopf lists and watches CRDs to find the resources it serves, even
when it serves only some namespaces.
*/}}
{{- define "bertjob.clusterRules" -}}
# kopf: finds the resources it serves, and notices CRDs being added or changed.
- apiGroups: [apiextensions.k8s.io]
  resources: [customresourcedefinitions]
  verbs: [list, watch]
{{- if .Values.watchNamespaces }}
# kopf, serving listed namespaces: lists and watches namespaces to serve those of the list that
# exist, and to notice one being created or deleted.
- apiGroups: [""]
  resources: [namespaces]
  verbs: [list, watch]
{{- end }}
# kopf's peering (bertjob.replicas): the replicas read and renew their records in the
# ClusterKopfPeering of the release, which the first replica makes.
- apiGroups: [kopf.dev]
  resources: [clusterkopfpeerings]
  verbs: [create, list, watch, patch]
{{- if .Values.progress.enabled }}
# The progress endpoint: checks each trainer's projected token (bertjob.progress).
- apiGroups: [authentication.k8s.io]
  resources: [tokenreviews]
  verbs: [create]
{{- end }}
{{- end }}

{{/* Granted in every namespace served: cluster-wide by the ClusterRole, or by a Role in each. */}}
{{- define "bertjob.namespacedRules" -}}
# kopf: posts events (kopf.warn, handler outcomes); it never updates them.
- apiGroups: [""]
  resources: [events]
  verbs: [create]
# The jobs: watched; patched for kopf's annotations; read when a child reports.
- apiGroups: [bertjob.dev]
  resources: [bertpretrainjobs]
  verbs: [get, list, watch, patch]
# Status: patched by the operator, its own fields and the trainers' progress reports alike.
- apiGroups: [bertjob.dev]
  resources: [bertpretrainjobs/status]
  verbs: [patch]
# Children carry blockOwnerDeletion, which the OwnerReferencesPermissionEnforcement admission
# plugin allows only to those who may update the owner's finalizers.
- apiGroups: [bertjob.dev]
  resources: [bertpretrainjobs/finalizers]
  verbs: [update]
# The children: created, and read back when a retried handler or a restarted operator finds
# one existing. No delete: deletion cascades through ownerReferences.
- apiGroups: [""]
  resources: [configmaps]
  verbs: [create, get]
# The data Job and the launchers' training jobs: also watched (outcome, conditions) and
# patched (suspend and the other safe run-policy fields).
- apiGroups: [batch]
  resources: [jobs]
  verbs: [create, get, list, watch, patch]
- apiGroups: [kubeflow.org]
  resources: [pytorchjobs, mpijobs]
  verbs: [create, get, list, watch, patch]
# Kubeflow Trainer v2 (launcher trainjob). The runtimes a TrainJob names are never read:
# Trainer v2 resolves them itself.
- apiGroups: [trainer.kubeflow.org]
  resources: [trainjobs]
  verbs: [create, get, list, watch, patch]
# A job's pods (by its label): listed once when its training job fails, to name the pod that
# failed and its exit code in the job's status; read (get) by the progress endpoint, once per pod,
# to check that a report's pod belongs to the job it reports for. Never watched, never changed.
- apiGroups: [""]
  resources: [pods]
  verbs: [{{ if .Values.progress.enabled }}get, {{ end }}list]
{{- end }}

{{/*
A map or list of values as YAML in the style of this chart's templates, lists indented under their
key, so that a value whose default the templates used to spell out renders as it did (manifests/ is
generated from the defaults). Called with (dict "value" V "first" (list KEY ...)): the keys of a
map (or of each map in a list) named in "first" come first, in that order, then the others sorted
as toYaml sorts them; scalars, empty maps and empty lists are toYaml's.
*/}}
{{- define "bertjob.yaml" -}}
{{- $value := .value -}}
{{- if and (kindIs "map" $value) $value -}}
{{- range $key := concat (.first | default list) (keys $value | sortAlpha) | uniq -}}
{{- if hasKey $value $key -}}
{{- $sub := get $value $key }}
{{- if and (or (kindIs "map" $sub) (kindIs "slice" $sub)) $sub }}
{{ toYaml $key }}:
{{- include "bertjob.yaml" (dict "value" $sub) | trim | nindent 2 }}
{{- else }}
{{ toYaml $key }}: {{ toYaml $sub }}
{{- end -}}
{{- end -}}
{{- end -}}
{{- else if and (kindIs "slice" $value) $value -}}
{{- range $item := $value }}
- {{ include "bertjob.yaml" (dict "value" $item "first" $.first) | trim | indent 2 | trimPrefix "  " }}
{{- end -}}
{{- else -}}
{{ toYaml $value }}
{{- end -}}
{{- end }}

{{/*
The runtimes' image, trainingRuntimes.image, with global.imageRegistry in place of its registry:
its first part is a registry when it holds a "." or ":" or is localhost, as the container
runtimes' reference parser decides (docker.io's short names have none).
*/}}
{{- define "bertjob.runtimeImage" -}}
{{- $image := .Values.trainingRuntimes.image -}}
{{- with .Values.global.imageRegistry -}}
{{- $parts := splitList "/" $image -}}
{{- $first := first $parts -}}
{{- if and (gt (len $parts) 1) (or (contains "." $first) (contains ":" $first) (eq $first "localhost")) -}}
{{- $image = rest $parts | join "/" -}}
{{- end -}}
{{- $image = printf "%s/%s" . $image -}}
{{- end -}}
{{- $image -}}
{{- end }}

{{/*
The operator pod's pull secrets: global.imagePullSecrets, then imagePullSecrets, each once.
*/}}
{{- define "bertjob.imagePullSecrets" -}}
{{- concat .Values.global.imagePullSecrets .Values.imagePullSecrets | uniq | toJson -}}
{{- end }}

{{/*
Checks that a values schema cannot word (Helm prints a refused "not" as "'not' failed"): each
fails naming the value and why.
*/}}
{{- define "bertjob.checks" -}}
{{- $chartLabels := "^(helm\\.sh/chart|app\\.kubernetes\\.io/(name|instance|version|managed-by|component)|rbac\\.authorization\\.(k8s\\.io|kubeflow\\.org)/aggregate-to-.*|trainer\\.kubeflow\\.org/framework)$" -}}
{{- range $key, $_ := .Values.commonLabels }}
{{- if regexMatch $chartLabels $key }}
{{- fail (printf "commonLabels: %q is a label the chart sets itself (app.kubernetes.io/*, helm.sh/chart, rbac.authorization.k8s.io/aggregate-to-*, rbac.authorization.kubeflow.org/aggregate-to-*, trainer.kubeflow.org/framework); choose another key" $key) }}
{{- end }}
{{- end }}
{{- range $key, $_ := .Values.podLabels }}
{{- if has $key (list "app.kubernetes.io/name" "app.kubernetes.io/instance" "app.kubernetes.io/component") }}
{{- fail (printf "podLabels: %q is a label of the Deployment's selector, which cannot change; choose another key" $key) }}
{{- end }}
{{- end }}
{{- range $index, $env := .Values.extraEnv }}
{{- if eq $env.name "BERTJOB_METRICS_PORT" }}
{{- fail (printf "extraEnv[%d].name: BERTJOB_METRICS_PORT is set by the chart (the metrics port, 9090)" $index) }}
{{- end }}
{{- if and $.Values.progress.enabled (hasPrefix "BERTJOB_PROGRESS_" $env.name) }}
{{- fail (printf "extraEnv[%d].name: %s is set by the chart from progress.*; set those values instead" $index $env.name) }}
{{- end }}
{{- end }}
{{- $chartArgs := "^(--(standalone|dev|peering|priority|all-namespaces|namespace|liveness|module|quiet|verbose)(=.*)?|-[A-Za-z]*[APLpmnqv].*)$" -}}
{{- range $index, $arg := .Values.extraArgs }}
{{- if regexMatch $chartArgs $arg }}
{{- fail (printf "extraArgs[%d]: %q is an argument the chart sets from other values (watchNamespaces, logLevel, the liveness probe, peering), or a short form of one; set that value instead" $index $arg) }}
{{- end }}
{{- end }}
{{- range $index, $volume := .Values.extraVolumes }}
{{- if has $volume.name (list "tmp" "webhook-tls") }}
{{- fail (printf "extraVolumes[%d].name: %q is a volume of the chart's own; choose another name" $index $volume.name) }}
{{- end }}
{{- end }}
{{- range $index, $mount := .Values.extraVolumeMounts }}
{{- if has (trimSuffix "/" $mount.mountPath) (list "/tmp" "/etc/bertjob/webhook") }}
{{- fail (printf "extraVolumeMounts[%d].mountPath: %q is where the chart mounts a volume of its own; choose another path" $index $mount.mountPath) }}
{{- end }}
{{- end }}
{{- with .Values.podDisruptionBudget }}
{{- if and .enabled (kindIs "float64" .minAvailable) (ge (int .minAvailable) (int $.Values.replicaCount)) }}
{{- fail (printf "podDisruptionBudget.minAvailable: %v of %v replicas (replicaCount) would let no drain evict any; lower it or raise replicaCount" .minAvailable $.Values.replicaCount) }}
{{- end }}
{{- end }}
{{- $taken := dict "8080" "the health port" "9090" "the metrics port" }}
{{- with get $taken (toString .Values.webhook.port) }}
{{- fail (printf "webhook.port: %v is %s of the operator; choose another (1024-65535)" $.Values.webhook.port .) }}
{{- end }}
{{- if .Values.webhook.enabled }}{{ $_ := set $taken (toString .Values.webhook.port) "the webhook's port" }}{{ end }}
{{- with get $taken (toString .Values.progress.port) }}
{{- fail (printf "progress.port: %v is %s of the operator; choose another (1024-65535)" $.Values.progress.port .) }}
{{- end }}
{{- end }}
