{{- define "osas.labels" -}}
app.kubernetes.io/name: osas
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}
