{{/*
Fixed object names: the plugin bypasses its own DaemonSet's pods by the name prefix
"istio-cni-node-" in POD_NAMESPACE (Istio's convention), so these do not follow the release name
(Istio's chart has the same fixed names).

Every template sees .Values after templates/zzz_profile.yaml (defaults < profile files < user
values) and templates/zzy_descope_legacy.yaml (`cni.X` over `X`) have run.
*/}}

{{/* Labels on every object: ours + Istio's "istio.labels" (app.kubernetes.io/part-of: istio). */}}
{{- define "istio-cni.labels" -}}
app.kubernetes.io/name: istio-cni
app.kubernetes.io/instance: {{ .Release.Name | quote }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service | quote }}
app.kubernetes.io/part-of: "istio"
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" | quote }}
{{- end }}

{{/* Istio's per-object labels (DaemonSet, ConfigMap, ServiceAccount, RBAC, NetworkPolicy). */}}
{{- define "istio-cni.istioLabels" -}}
release: {{ .Release.Name | quote }}
istio.io/rev: {{ .Values.revision | default "default" | quote }}
install.operator.istio.io/owning-resource: {{ .Values.ownerName | default "unknown" | quote }}
operator.istio.io/component: "Cni"
{{- end }}

{{/* global.resourceScope: "true" when namespaced / cluster-scoped objects are rendered. */}}
{{- define "istio-cni.namespaced" -}}
{{- has .Values.global.resourceScope (list "all" "namespace") -}}
{{- end }}
{{- define "istio-cni.clusterScoped" -}}
{{- has .Values.global.resourceScope (list "all" "cluster") -}}
{{- end }}

{{/* Effective platform: platform, else global.platform (Istio's coalesce). */}}
{{- define "istio-cni.platform" -}}
{{- coalesce .Values.platform .Values.global.platform | default "" -}}
{{- end }}

{{/*
The image: `image` when it contains "/" (a full reference, as Istio), else
"<hub|global.hub>/<image>:<tag|global.tag>". Istio appends "-<variant>" to the tag; our one image
is already distroless (FROM scratch, no shell), so the variant is not appended (NOTES.txt).
*/}}
{{- define "istio-cni.image" -}}
{{- if contains "/" .Values.image -}}
{{ .Values.image }}
{{- else -}}
{{ .Values.hub | default .Values.global.hub }}/{{ .Values.image | default "install-cni" }}:{{ .Values.tag | default .Values.global.tag }}
{{- end -}}
{{- end }}

{{/*
Redirect backend: redirectBackend, or nft with Istio's global.nativeNftables.
*/}}
{{- define "istio-cni.backend" -}}
{{- if .Values.global.nativeNftables -}}
{{- if eq .Values.redirectBackend "iptables-legacy" -}}
{{- fail "global.nativeNftables=true contradicts redirectBackend=iptables-legacy: set one of them" -}}
{{- end -}}
nft
{{- else -}}
{{ .Values.redirectBackend }}
{{- end -}}
{{- end }}

{{/*
Log levels "<daemon> <plugin>": Istio's logging.level, else global.logging.level, else logLevel.
Istio's value is a level or "scope:level,..." pairs: "default" sets both, "cni-plugin" the
plugin's; other scopes are ignored (NOTES.txt). Istio's "none" is our "panic" (the quietest).
*/}}
{{- define "istio-cni.logLevels" -}}
{{- $daemon := .Values.logLevel -}}
{{- $plugin := "" -}}
{{- with coalesce .Values.logging.level .Values.global.logging.level -}}
{{- range splitList "," . -}}
{{- $kv := splitList ":" (trim .) -}}
{{- if eq (len $kv) 1 -}}{{- $daemon = first $kv -}}
{{- else if eq (first $kv) "default" -}}{{- $daemon = last $kv -}}
{{- else if eq (first $kv) "cni-plugin" -}}{{- $plugin = last $kv -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- $daemon = ternary "panic" $daemon (eq $daemon "none") -}}
{{- $plugin = ternary "panic" $plugin (eq $plugin "none") -}}
{{- $daemon }} {{ $plugin | default $daemon -}}
{{- end }}

{{/* Scopes of logging.level / global.logging.level this chart does not map (for NOTES.txt). */}}
{{- define "istio-cni.ignoredLogScopes" -}}
{{- $out := list -}}
{{- with coalesce .Values.logging.level .Values.global.logging.level -}}
{{- range splitList "," . -}}
{{- $kv := splitList ":" (trim .) -}}
{{- if and (eq (len $kv) 2) (not (has (first $kv) (list "default" "cni-plugin"))) -}}
{{- $out = append $out (first $kv) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- join "," $out -}}
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

{{/* Env names the chart sets on the container itself (env.* may not replace them). */}}
{{- define "istio-cni.fieldEnv" -}}
POD_NAMESPACE KUBERNETES_NODE_NAME REPAIR_NODE_NAME
{{- end }}
