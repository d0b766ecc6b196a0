{{/* Labels of the gpuwarden controller (controller-*.yaml): distinct from the agent's selector. */}}
{{- define "gpuwarden.controllerSelectorLabels" -}}
app.kubernetes.io/name: {{ printf "%s-controller" (include "gpuwarden.name" .) }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}
{{- define "gpuwarden.controllerLabels" -}}
{{ include "gpuwarden.controllerSelectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | quote }}
app.kubernetes.io/component: controller
{{- end -}}
