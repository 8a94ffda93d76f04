{{/*
Fixed object names: the plugin bypasses its own DaemonSet's pods by the name prefix
"istio-cni-node-" in POD_NAMESPACE (Istio's convention), so these do not follow the release name.
*/}}

{{- define "istio-cni.labels" -}}
app.kubernetes.io/name: istio-cni
app.kubernetes.io/instance: {{ .Release.Name | quote }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | quote }}
{{- end }}

{{/*
The repair action that will actually run: repair > delete > label (the daemon's precedence);
empty when repair is off or no mode is on.
*/}}
{{- define "istio-cni.repairMode" -}}
{{- if .Values.repair.enabled -}}
{{- if .Values.repair.repairPods -}}repair
{{- else if .Values.repair.deletePods -}}delete
{{- else if .Values.repair.labelPods -}}label
{{- end -}}
{{- end -}}
{{- end }}
