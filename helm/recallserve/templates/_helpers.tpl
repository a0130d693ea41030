{{/* Chart name, shortened to 63 chars (a DNS label). */}}
{{- define "recallserve.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name: <release>-<chart> unless the release already contains the chart name.
NOTE: 40 chars, not 63: KubeRay appends "-<5 char hash>" to the RayCluster and then
"-head-svc"/"-serve-svc"/"-worker-<group>-<hash>" to services and pods. */}}
{{- define "recallserve.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "recallserve.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Selector labels: stable across upgrades, shared by every pod of the release. */}}
{{- define "recallserve.selectorLabels" -}}
app.kubernetes.io/name: {{ include "recallserve.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "recallserve.labels" -}}
helm.sh/chart: {{ include "recallserve.chart" . }}
{{ include "recallserve.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: recallserve
{{- end }}

{{- define "recallserve.image" -}}
{{- $img := .override | default dict -}}
{{- $repo := $img.repository | default .root.Values.image.repository -}}
{{- $tag := $img.tag | default .root.Values.image.tag | default .root.Chart.AppVersion -}}
{{- printf "%s:%s" $repo $tag -}}
{{- end }}

{{- define "recallserve.stateDbSecretName" -}}
{{- .Values.stateDatabase.existingSecret | default (printf "%s-state-db" (include "recallserve.fullname" .)) }}
{{- end }}

{{- define "recallserve.secretName" -}}
{{- .Values.apiKeys.existingSecret | default (printf "%s-api-keys" (include "recallserve.fullname" .)) }}
{{- end }}

{{- define "recallserve.claimName" -}}
{{- .Values.persistence.existingClaim | default (printf "%s-shards" (include "recallserve.fullname" .)) }}
{{- end }}

{{/* The serve config text: --set-file serveConfig.inline wins over the chart file. */}}
{{- define "recallserve.serveConfigText" -}}
{{- if .Values.serveConfig.inline }}
{{- .Values.serveConfig.inline }}
{{- else }}
{{- $text := .Files.Get .Values.serveConfig.file }}
{{- if not $text }}
{{- fail (printf "serveConfig.file: %q is not a file in the chart; render one with `recallserve serve-config --target kubernetes`" .Values.serveConfig.file) }}
{{- end }}
{{- $text }}
{{- end }}
{{- end }}

{{/* The serve config checked against the chart's values; returns the text unchanged.
NOTE: the text is passed through verbatim (not re-serialised from the parsed map), because
fromYaml/toYaml would turn large integers such as memory bytes into floats like 2.1e+09.
Checks: it parses, has applications, no literal API keys, shard data under the volume. */}}
{{- define "recallserve.serveConfig" -}}
{{- $text := include "recallserve.serveConfigText" . }}
{{- $cfg := fromYaml $text }}
{{- if hasKey $cfg "Error" }}
{{- fail (printf "serveConfig: not valid YAML: %s" (get $cfg "Error")) }}
{{- end }}
{{- if not $cfg.applications }}
{{- fail "serveConfig: no applications; render it with `recallserve serve-config --target kubernetes`" }}
{{- end }}
{{- range $app := $cfg.applications }}
{{- $args := $app.args | default dict }}
{{- $auth := $args.auth | default dict }}
{{- if $auth.keys }}
{{- fail (printf "serveConfig: application %q carries literal auth.keys; render with --target kubernetes (keys come from the apiKeys Secret)" $app.name) }}
{{- end }}
{{- if $.Values.persistence.enabled }}
{{- $mem := $args.memory | default dict }}
{{- $dir := toString ($mem.data_dir | default "") }}
{{- if not (hasPrefix (printf "%s/" (trimSuffix "/" $.Values.persistence.mountPath)) $dir) }}
{{- fail (printf "serveConfig: application %q has memory.data_dir %q outside persistence.mountPath %q; render with --data-dir under it" $app.name $dir $.Values.persistence.mountPath) }}
{{- end }}
{{- $state := toString ($args.state_dir | default "") }}
{{- if not (hasPrefix (printf "%s/" (trimSuffix "/" $.Values.persistence.mountPath)) $state) }}
{{- fail (printf "serveConfig: application %q has state_dir %q outside persistence.mountPath %q; sessions and experiences would be lost with the pod (render with --target kubernetes)" $app.name $state $.Values.persistence.mountPath) }}
{{- end }}
{{- $mig := $mem.migration | default dict }}
{{- if $mig.data_dir }}
{{- if not (hasPrefix (printf "%s/" (trimSuffix "/" $.Values.persistence.mountPath)) (toString $mig.data_dir)) }}
{{- fail (printf "serveConfig: application %q has memory.migration.data_dir %q outside persistence.mountPath %q; use a relative folder (it becomes a sibling of memory.data_dir) or one under the mount" $app.name (toString $mig.data_dir) $.Values.persistence.mountPath) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- $text }}
{{- end }}

{{/* The Serve HTTP port from the serve config (KubeRay's serve Service targets it). */}}
{{- define "recallserve.servePort" -}}
{{- $cfg := fromYaml (include "recallserve.serveConfigText" .) }}
{{- $http := $cfg.http_options | default dict }}
{{- $http.port | default 8000 | int }}
{{- end }}

{{/* Environment shared by every Ray container. */}}
{{- define "recallserve.env" -}}
- name: RECALLSERVE_API_KEYS
  valueFrom:
    secretKeyRef:
      name: {{ include "recallserve.secretName" . }}
      key: {{ .Values.apiKeys.secretKey }}
{{- /* NOTE: the serve config's state_db.dsn_env (deployments/serve_config.py K8S_STATE_DSN_ENV). */}}
- name: RECALLSERVE_STATE_DSN
  valueFrom:
    secretKeyRef:
      name: {{ include "recallserve.stateDbSecretName" . }}
      key: {{ .Values.stateDatabase.secretKey }}
{{- if .Values.metrics.exporter.enabled }}
- name: PROMETHEUS_MULTIPROC_DIR
  value: {{ .Values.metrics.exporter.folder | quote }}
{{- end }}
{{- /* NOTE: the same variables as deployments/runner.py THROUGHPUT_ENV (tests/unit/test_runner_grpc.py checks). */}}
{{- if .Values.serveThroughputOptimized }}
- name: RAY_SERVE_THROUGHPUT_OPTIMIZED
  value: "1"
- name: RAY_SERVE_ENABLE_DIRECT_INGRESS
  value: "0"
- name: RAY_SERVE_PROXY_USE_GRPC
  value: "1"
- name: RAY_SERVE_REQUEST_PATH_LOG_BUFFER_SIZE
  value: "1"
- name: RAY_SERVE_LOG_TO_STDERR
  value: "1"
- name: RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP
  value: "1"
{{- end }}
{{- with .Values.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* The metrics exporter sidecar: the summed recallserve_* metrics of the pod's Ray processes.
     Args: dict "root" (the chart context) "image" (the pod's image). */}}
{{- define "recallserve.metricsExporter" -}}
{{- $m := .root.Values.metrics.exporter }}
- name: metrics-exporter
  image: {{ .image }}
  imagePullPolicy: {{ .root.Values.image.pullPolicy }}
  command: ["python", "-m", "recallserve.serve.api.metrics_exporter", "--host", "0.0.0.0",
            "--port", {{ $m.port | quote }}, "--dir", {{ $m.folder | quote }}]
  ports:
    - name: rs-metrics
      containerPort: {{ $m.port }}
  readinessProbe:
    httpGet:
      path: /healthz
      port: rs-metrics
    periodSeconds: 10
  resources:
    {{- toYaml $m.resources | nindent 4 }}
  volumeMounts:
    - name: recallserve-metrics
      mountPath: {{ $m.folder }}
{{- end }}

{{- define "recallserve.volumeMounts" -}}
- name: shm
  mountPath: /dev/shm
{{- if .Values.metrics.exporter.enabled }}
- name: recallserve-metrics
  mountPath: {{ .Values.metrics.exporter.folder }}
{{- end }}
{{- if .Values.persistence.enabled }}
- name: shard-data
  mountPath: {{ .Values.persistence.mountPath }}
{{- end }}
{{- end }}

{{- define "recallserve.volumes" -}}
- name: shm
  emptyDir:
    medium: Memory
    sizeLimit: {{ .Values.shmSize }}
{{- if .Values.metrics.exporter.enabled }}
- name: recallserve-metrics
  emptyDir:
    sizeLimit: 256Mi
{{- end }}
{{- if .Values.persistence.enabled }}
- name: shard-data
  persistentVolumeClaim:
    claimName: {{ include "recallserve.claimName" . }}
{{- end }}
{{- end }}
