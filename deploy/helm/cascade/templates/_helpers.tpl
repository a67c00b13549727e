{{/* Names, labels and the pieces every workload shares. */}}

{{- define "cascade.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "cascade.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* Selector labels of one component: (dict "root" $ "component" "rollout") */}}
{{- define "cascade.selector" -}}
app.kubernetes.io/name: {{ .root.Chart.Name }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "cascade.componentLabels" -}}
{{ include "cascade.labels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* Image reference: (dict "root" $ "repository" "cascade-api") */}}
{{- define "cascade.image" -}}
{{- $registry := .root.Values.image.registry -}}
{{- $tag := .root.Values.image.tag | default .root.Chart.AppVersion -}}
{{- if $registry -}}
{{- printf "%s/%s:%s" (trimSuffix "/" $registry) .repository $tag -}}
{{- else -}}
{{- printf "%s:%s" .repository $tag -}}
{{- end -}}
{{- end -}}

{{- define "cascade.secretName" -}}
{{- .Values.secrets.existingSecret | default (printf "%s-secrets" (include "cascade.fullname" .)) -}}
{{- end -}}

{{- define "cascade.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- .Values.serviceAccount.name | default (include "cascade.fullname" .) -}}
{{- else -}}
{{- .Values.serviceAccount.name | default "default" -}}
{{- end -}}
{{- end -}}

{{/* CASCADE_REDIS_URL from the Secret; later env entries and args build on it with $(...). */}}
{{- define "cascade.redisEnv" -}}
- name: CASCADE_REDIS_URL
  valueFrom:
    secretKeyRef: {name: {{ include "cascade.secretName" . }}, key: redis-url}
{{- end -}}

{{- define "cascade.databaseEnv" -}}
- name: CASCADE_DATABASE_URL
  valueFrom:
    secretKeyRef: {name: {{ include "cascade.secretName" . }}, key: database-url}
{{- end -}}

{{/* Scheduling of a GPU service: its own nodeSelector/tolerations/affinity, else gpu's. */}}
{{- define "cascade.gpuScheduling" -}}
{{- $gpu := .root.Values.gpu -}}
{{- with (.values.nodeSelector | default $gpu.nodeSelector) }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with (.values.tolerations | default $gpu.tolerations) }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with (.values.affinity | default $gpu.affinity) }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{- define "cascade.scheduling" -}}
{{- with .nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* Resources of a GPU container: its resources plus N GPUs, requested and limited alike. */}}
{{- define "cascade.gpuResources" -}}
{{- $res := deepCopy (.values.resources | default dict) -}}
{{- if gt (int .values.gpus) 0 -}}
{{- $requests := get $res "requests" | default dict -}}
{{- $limits := get $res "limits" | default dict -}}
{{- $_ := set $requests .root.Values.gpu.resourceName (int .values.gpus) -}}
{{- $_ := set $limits .root.Values.gpu.resourceName (int .values.gpus) -}}
{{- $_ := set $res "requests" $requests -}}
{{- $_ := set $res "limits" $limits -}}
{{- end -}}
{{- toYaml $res -}}
{{- end -}}

{{- define "cascade.device" -}}
{{- if gt (int .gpus) 0 }}cuda{{ else }}cpu{{ end -}}
{{- end -}}

{{- define "cascade.checkpointClaim" -}}
{{- .Values.checkpoints.existingClaim | default (printf "%s-checkpoints" (include "cascade.fullname" .)) -}}
{{- end -}}

{{/* The models volume (read-only at /models) and the checkpoints volume at /checkpoints. */}}
{{- define "cascade.dataVolumes" -}}
- name: checkpoints
  persistentVolumeClaim:
    claimName: {{ include "cascade.checkpointClaim" . }}
{{- if .Values.models.existingClaim }}
- name: models
  persistentVolumeClaim:
    claimName: {{ .Values.models.existingClaim }}
    readOnly: true
{{- end }}
{{- end -}}

{{/* (dict "root" $ "checkpointsReadOnly" true) */}}
{{- define "cascade.dataMounts" -}}
- name: checkpoints
  mountPath: /checkpoints
  readOnly: {{ .checkpointsReadOnly }}
{{- if .root.Values.models.existingClaim }}
- name: models
  mountPath: /models
  readOnly: true
{{- else }}
- name: checkpoints
  mountPath: /models
  subPath: {{ .root.Values.models.subPath }}
  readOnly: true
{{- end }}
{{- end -}}

{{/* Only the models, read-only at /models (the reward workers' rlhf reward models). */}}
{{- define "cascade.modelsMount" -}}
{{- if .Values.models.existingClaim }}
- name: models
  mountPath: /models
  readOnly: true
{{- else }}
- name: checkpoints
  mountPath: /models
  subPath: {{ .Values.models.subPath }}
  readOnly: true
{{- end }}
{{- end -}}
