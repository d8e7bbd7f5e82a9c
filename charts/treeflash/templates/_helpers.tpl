{{- define "treeflash.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "treeflash.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "treeflash.selectorLabels" -}}
app.kubernetes.io/name: {{ include "treeflash.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "treeflash.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{ include "treeflash.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* The Secret holding the API key: the user's, or the one this chart creates from apiKey.value. */}}
{{- define "treeflash.apiKeySecret" -}}
{{- if .Values.apiKey.existingSecret -}}
{{- .Values.apiKey.existingSecret -}}
{{- else if .Values.apiKey.value -}}
{{- printf "%s-api-key" (include "treeflash.fullname" .) -}}
{{- end -}}
{{- end -}}

{{/* `treeflash serve` flags after the image's entrypoint (treeflash serve --host 0.0.0.0 --port 8000). */}}
{{- define "treeflash.args" -}}
{{- $v := .Values -}}
{{- if and $v.model.hub $v.model.path -}}
{{- fail "set one of model.hub and model.path, not both" -}}
{{- end -}}
{{- if and $v.model.path (not $v.storage.models.existingClaim) -}}
{{- fail "model.path needs storage.models.existingClaim (the PVC that holds the model)" -}}
{{- end -}}
{{- if and (eq $v.device "cpu") (gt (int $v.gpu.count) 0) -}}
{{- fail "device cpu with gpu.count > 0: set gpu.count 0 on CPU nodes" -}}
{{- end -}}
{{- $args := list -}}
{{- with (or $v.model.hub $v.model.path) }}{{ $args = concat $args (list "--model" .) }}{{ end -}}
{{- with $v.model.servedName }}{{ $args = concat $args (list "--served-model-name" .) }}{{ end -}}
{{- $args = concat $args (list "--device" $v.device) -}}
{{- with $v.dtype }}{{ $args = concat $args (list "--dtype" .) }}{{ end -}}
{{- $args = concat $args (list "--max-context" (toString $v.maxContext)) -}}
{{- $args = concat $args (list "--cache-type-k" $v.cacheTypeK "--cache-type-v" $v.cacheTypeV) -}}
{{- with $v.draft.type }}{{ $args = concat $args (list "--draft" .) }}{{ end -}}
{{- with $v.draft.model }}{{ $args = concat $args (list "--draft-model" .) }}{{ end -}}
{{- if not (kindIs "invalid" $v.draft.numDraft) }}{{ $args = concat $args (list "--num-draft" (toString $v.draft.numDraft)) }}{{ end -}}
{{- $args = concat $args (list "--budget" (toString $v.budget)) -}}
{{- if $v.noTree }}{{ $args = concat $args (list "--no-tree") }}{{ end -}}
{{- $args = concat $args (list "--max-queue" (toString $v.maxQueue)) -}}
{{- if include "treeflash.apiKeySecret" . }}{{ $args = concat $args (list "--api-key" "$(TREEFLASH_API_KEY)") }}{{ end -}}
{{- range $v.extraArgs }}{{ $args = append $args (toString .) }}{{ end -}}
{{- toYaml $args -}}
{{- end -}}
