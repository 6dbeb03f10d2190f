{{- define "sc-app.validatePlacement" -}}
{{- end -}}
