{{/*
Names, labels and RBAC rules shared by the templates.
*/}}

{{/* The chart's name, or nameOverride. */}}
{{- define "elasticjob-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/*
The name of the release's objects: fullnameOverride, else the release name when it already
holds the chart name, else "<release>-<chart>". At most 63 characters: it is also a DNS label
(the Service) and the name of the ValidatingWebhookConfiguration the operator manages.
*/}}
{{- define "elasticjob-operator.fullname" -}}
{{- $name := include "elasticjob-operator.name" . -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* "<chart>-<version>", the value of the helm.sh/chart label. */}}
{{- define "elasticjob-operator.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels that select the operator's pod; they never change across upgrades. */}}
{{- define "elasticjob-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "elasticjob-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* Labels of every object of the release. */}}
{{- define "elasticjob-operator.labels" -}}
{{ include "elasticjob-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | trunc 63 | trimSuffix "-" | quote }}
app.kubernetes.io/component: operator
app.kubernetes.io/part-of: elasticjob
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ include "elasticjob-operator.chart" . }}
{{- end -}}

{{/* The operator's ServiceAccount. */}}
{{- define "elasticjob-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "elasticjob-operator.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The image reference; the tag defaults to the chart's appVersion. */}}
{{- define "elasticjob-operator.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}

{{/* Where workers reach the rendezvous service: https unless rendezvous.tls is off. */}}
{{- define "elasticjob-operator.rendezvousURL" -}}
{{- $scheme := ternary "https" "http" .Values.rendezvous.tls.enabled -}}
{{- printf "%s://%s.%s.svc:8470" $scheme (include "elasticjob-operator.fullname" .) .Release.Namespace -}}
{{- end -}}

{{/*
The Secret in which the operator keeps the rendezvous certificate it makes (when TLS is on and
no rendezvous.tls.secretName is given); empty otherwise.
*/}}
{{- define "elasticjob-operator.managedTLSSecret" -}}
{{- if and .Values.rendezvous.tls.enabled (not .Values.rendezvous.tls.secretName) -}}
{{- printf "%s-rendezvous-tls" (include "elasticjob-operator.fullname" .) -}}
{{- end -}}
{{- end -}}

{{/* The rendezvous certificate's Secret the cluster admin provides, if TLS is on; else empty. */}}
{{- define "elasticjob-operator.providedTLSSecret" -}}
{{- if .Values.rendezvous.tls.enabled -}}
{{- .Values.rendezvous.tls.secretName -}}
{{- end -}}
{{- end -}}

{{/*
RBAC rules on the namespaced resources the operator handles: in a ClusterRole when every
namespace is watched, else in a Role per watched namespace.
*/}}
{{- define "elasticjob-operator.namespacedRules" -}}
- apiGroups: ["elasticjob.dev"]
  resources: ["elasticjobs", "elasticjobs/status", "elasticjobs/scale"]
  verbs: ["get", "list", "watch", "patch", "update"]
# A finished job is deleted once its spec.ttlSecondsAfterFinished has passed.
- apiGroups: ["elasticjob.dev"]
  resources: ["elasticjobs"]
  verbs: ["delete"]
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch", "create", "delete", "patch"]
# A job's Secret (its rendezvous key, and each worker pod's own credential under the pod's
# name): read, created when missing, patched as pods come and go (garbage-collected with the
# job through its owner reference, so never deleted, listed or watched by the operator).
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["get", "create", "patch"]
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create", "patch"]
- apiGroups: ["events.k8s.io"]
  resources: ["events"]
  verbs: ["create", "patch"]
# A job's PodDisruptionBudget (minAvailable = minReplicas): created, then kept at the job's
# minimum; garbage-collected with the job.
- apiGroups: ["policy"]
  resources: ["poddisruptionbudgets"]
  verbs: ["create", "patch"]
# Each job's NetworkPolicy: only its own worker pods reach its workers; garbage-collected with
# the job.
- apiGroups: ["networking.k8s.io"]
  resources: ["networkpolicies"]
  verbs: ["create", "patch"]
# A job's record (ConfigMap <job>-record: its timeline), kept across operator restarts and
# garbage-collected with the job.
- apiGroups: [""]
  resources: ["configmaps"]
  verbs: ["get", "create", "patch"]
{{- end -}}

{{/* RBAC rules on cluster-scoped resources: always in a ClusterRole. */}}
{{- define "elasticjob-operator.clusterRules" -}}
- apiGroups: [""]
  resources: ["nodes"]
  verbs: ["get", "list", "watch"]
- apiGroups: ["apiextensions.k8s.io"]
  resources: ["customresourcedefinitions"]
  verbs: ["get", "list", "watch"]
{{- if .Values.webhook.enabled }}
# The operator creates its ValidatingWebhookConfiguration (a create cannot be limited by name)
# and may only read and change that one afterwards.
- apiGroups: ["admissionregistration.k8s.io"]
  resources: ["validatingwebhookconfigurations", "mutatingwebhookconfigurations"]
  verbs: ["create"]
- apiGroups: ["admissionregistration.k8s.io"]
  resources: ["validatingwebhookconfigurations", "mutatingwebhookconfigurations"]
  resourceNames: [{{ include "elasticjob-operator.webhookConfigName" . | quote }}]
  verbs: ["get", "list", "watch", "patch", "update"]
# The operator makes this ClusterRole the owner of its webhook configurations (it reads its uid),
# so that they go with the release.
- apiGroups: ["rbac.authorization.k8s.io"]
  resources: ["clusterroles"]
  resourceNames: [{{ include "elasticjob-operator.clusterRoleName" . | quote }}]
  verbs: ["get"]
{{- end }}
{{- end -}}

{{/*
Name of the release's ClusterRole (it also owns the webhook configurations).
*/}}
{{- define "elasticjob-operator.clusterRoleName" -}}
{{ include "elasticjob-operator.fullname" . }}-cluster
{{- end -}}

{{/*
Name of the ValidatingWebhookConfiguration the operator manages: <service>.<namespace>.svc
(webhook names must be domains of three or more labels, and kopf derives them from it).
*/}}
{{- define "elasticjob-operator.webhookConfigName" -}}
{{- printf "%s.%s.svc" (include "elasticjob-operator.fullname" .) .Release.Namespace -}}
{{- end -}}

{{/* The Service in front of every ready replica (admission reviews, metrics). */}}
{{- define "elasticjob-operator.replicasService" -}}
{{- printf "%s-replicas" (include "elasticjob-operator.fullname" . | trunc 54 | trimSuffix "-") -}}
{{- end -}}

{{/* The Lease the replicas elect their leader with. */}}
{{- define "elasticjob-operator.leaseName" -}}
{{ include "elasticjob-operator.fullname" . }}-leader
{{- end -}}

{{/* The Secret in which the operator keeps the webhook's certificate (every replica serves it). */}}
{{- define "elasticjob-operator.webhookTLSSecret" -}}
{{ include "elasticjob-operator.fullname" . }}-webhook-tls
{{- end -}}
