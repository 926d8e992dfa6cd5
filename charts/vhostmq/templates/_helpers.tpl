{{- define "vhostmq.name" -}}vhostmq{{- end -}}

{{- define "vhostmq.labels" -}}
app.kubernetes.io/name: vhostmq
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "vhostmq.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag }}
{{- end -}}

{{- define "vhostmq.webhookName" -}}{{ .Release.Name }}-webhook{{- end -}}

{{- define "vhostmq.sidecarImage" -}}
{{- if .Values.kubevirt.sidecarImage -}}
{{ .Values.kubevirt.sidecarImage }}
{{- else -}}
{{ .Values.image.repository }}/kubevirt-binding:{{ .Values.image.tag }}
{{- end -}}
{{- end -}}
