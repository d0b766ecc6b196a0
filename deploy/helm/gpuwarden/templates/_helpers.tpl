{{/* Names and labels. deploy/render.py mirrors these with release name "gpuwarden". */}}
{{- define "gpuwarden.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "gpuwarden.fullname" -}}
{{- if contains (include "gpuwarden.name" .) .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name (include "gpuwarden.name" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "gpuwarden.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gpuwarden.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "gpuwarden.labels" -}}
{{ include "gpuwarden.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | quote }}
app.kubernetes.io/component: agent
{{- end -}}

{{/* The kubectl plugin's roles (kubectl-rbac.yaml): no pod selects them. */}}
{{- define "gpuwarden.kubectlLabels" -}}
{{ include "gpuwarden.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | quote }}
app.kubernetes.io/component: kubectl
{{- end -}}

{{- define "gpuwarden.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "gpuwarden.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The names of the nodes in .nodes (a NodeList as `lookup` returns it) that carry any one of the
     labels in .labels (values.gpuNodeLabels; empty: every node), comma-separated. NOTES.txt uses
     it to warn when the DaemonSet would schedule no pod. */}}
{{- define "gpuwarden.gpuNodes" -}}
{{- $names := list -}}
{{- range $n := (.nodes.items | default list) -}}
{{-   $labels := $n.metadata.labels | default dict -}}
{{-   $hit := empty $.labels -}}
{{-   range $k, $v := $.labels -}}
{{-     if eq (toString (get $labels $k)) (toString $v) -}}{{- $hit = true -}}{{- end -}}
{{-   end -}}
{{-   if $hit -}}{{- $names = append $names $n.metadata.name -}}{{- end -}}
{{- end -}}
{{- join "," $names -}}
{{- end -}}


{{/* "true" when the node-confinement policy is rendered (nodeConfinement.create: auto | true | false),
else "". auto follows the cluster's version: the policy keys on the node-name claim of the agent's
bound token, which Kubernetes 1.32 carries; below it the policy would deny every write of the agent.
true below 1.30 (no admissionregistration.k8s.io/v1 policy API) fails the install saying what to set. */}}
{{- define "gpuwarden.nodeConfinement" -}}
{{- $want := .Values.nodeConfinement.create | toString -}}
{{- $kube := .Capabilities.KubeVersion.Version -}}
{{- if eq $want "auto" -}}
{{- if semverCompare ">=1.32.0-0" $kube }}true{{ end -}}
{{- else if eq $want "true" -}}
{{- if not (semverCompare ">=1.30.0-0" $kube) -}}
{{- fail (printf "nodeConfinement.create=true needs Kubernetes >= 1.30 (admissionregistration.k8s.io/v1 ValidatingAdmissionPolicy) and >= 1.32 for the agent's node-name token claim; this cluster is %s: set nodeConfinement.create=auto (or false) to install without it" $kube) -}}
{{- end -}}
true
{{- else if ne $want "false" -}}
{{- fail (printf "nodeConfinement.create must be auto, true or false, not %q" $want) -}}
{{- end -}}
{{- end -}}
