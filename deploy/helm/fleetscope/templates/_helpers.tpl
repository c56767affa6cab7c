{{/* The chart's name, or nameOverride. */}}
{{- define "fleetscope.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Object name prefix: the release name when it already says fleetscope, else <release>-fleetscope. */}}
{{- define "fleetscope.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := include "fleetscope.name" . -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Labels that select this release's daemons (immutable once installed). */}}
{{- define "fleetscope.selectorLabels" -}}
app.kubernetes.io/name: {{ include "fleetscope.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/part-of: fleetscope
{{- end -}}

{{/* Labels on every object. */}}
{{- define "fleetscope.labels" -}}
{{ include "fleetscope.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* The fleetscope image: repository, then the digest or the tag (default: appVersion). */}}
{{- define "fleetscope.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}
{{- end -}}

{{- define "fleetscope.pushSecretName" -}}
{{- .Values.push.tokenSecret.name | default (printf "%s-push" (include "fleetscope.fullname" .)) -}}
{{- end -}}

{{/*
The scrape endpoint shared by the ServiceMonitor and the PodMonitor. Relabelings: job is fixed (the
rules select it, whatever the release is called), instance is the node's name (not hostIP:port), and the
operator's per-target labels go: pod changes with every rollout and would start new series for every
node, the rest are the same on every target (no series carries more than 15 labels, docs/metrics.md).
Metric relabelings drop the names a push could forge (issue 35): Prometheus's own (ALERTS,
ALERTS_FOR_STATE, up, scrape_*) and recording-rule names (with a colon): dropped at the scrape too,
defence in depth beside the push API's own checks.
*/}}
{{- define "fleetscope.scrapeEndpoint" -}}
{{- $monitor := .monitor -}}
path: /metrics
interval: {{ $monitor.interval }}
scrapeTimeout: {{ $monitor.scrapeTimeout }}
{{- if .root.Values.web.tls }}
scheme: https
{{- with $monitor.tlsConfig }}
tlsConfig:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}
{{- with $monitor.basicAuth }}
basicAuth:
  {{- toYaml . | nindent 2 }}
{{- end }}
relabelings:
  - targetLabel: job
    replacement: {{ $monitor.jobName }}
    action: replace
  - sourceLabels: [__meta_kubernetes_pod_node_name]
    targetLabel: instance
    action: replace
  - action: labeldrop
    regex: pod|container|endpoint|service|namespace
  {{- with $monitor.relabelings }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
metricRelabelings:
  - sourceLabels: [__name__]
    regex: ALERTS|ALERTS_FOR_STATE|up|scrape_.*|.*:.*
    action: drop
  {{- with $monitor.metricRelabelings }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- end -}}

{{/* The containers' securityContext: root for the device nodes, every capability dropped. */}}
{{- define "fleetscope.restricted" -}}
runAsUser: 0
runAsGroup: 0
privileged: false
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: [ALL]
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/*
node-problem-detector's two containers (the `verdicts` writer and the unmodified NPD image), put before
the daemon's. Probes: `verdicts` is live while its newest verdict is under 120 s old (it writes every 30
s, each round bounded to 10 s; a stuck writer is restarted; NPD itself reports a verdict that old as
Unknown); npd is live while its own server answers /healthz on the node's loopback, which it starts only
once it has reached the API server.
*/}}
{{- define "fleetscope.npdContainers" -}}
- name: verdicts
  image: {{ include "fleetscope.image" . }}
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  args:
    - check
    - --config=/etc/fleetscope/config.yaml
    - --path.sysfs=/host/sys
    - --path.procfs=/host/proc
    - --write=/run/fleetscope/verdicts
    - --every=30
  env:
    - name: NVIDIA_VISIBLE_DEVICES
      value: all
    - name: NVIDIA_DRIVER_CAPABILITIES
      value: utility
    # Prometheus labels each node's series instance=<node name> (the monitors' relabeling).
    - name: FLEETSCOPE_CHECK_INSTANCE
      valueFrom:
        fieldRef:
          fieldPath: spec.nodeName
    # Where the fleetscope alerts are evaluated (empty: the training condition stays Unknown, saying so).
    - name: FLEETSCOPE_CHECK_PROMETHEUS_URL
      value: {{ .Values.nodeProblemDetector.prometheusUrl | quote }}
  startupProbe:
    exec:
      command: [test, -s, /run/fleetscope/verdicts/gpu]
    periodSeconds: 10
    failureThreshold: 30
  readinessProbe:
    exec:
      command: [test, -s, /run/fleetscope/verdicts/gpu]
    periodSeconds: 30
  livenessProbe:
    exec:
      command:
        - sh
        - -c
        - test "$(( $(date +%s) - $(stat -c %Y /run/fleetscope/verdicts/gpu) ))" -lt 120
    periodSeconds: 30
    timeoutSeconds: 5
    failureThreshold: 2
  resources:
    {{- toYaml .Values.nodeProblemDetector.verdictsResources | nindent 4 }}
  securityContext:
    {{- include "fleetscope.restricted" . | nindent 4 }}
  volumeMounts:
    - name: config
      mountPath: /etc/fleetscope
      readOnly: true
    - name: sys
      mountPath: /host/sys
      readOnly: true
    - name: proc
      mountPath: /host/proc
      readOnly: true
    - name: verdicts
      mountPath: /run/fleetscope/verdicts
    # check.repaired-file: touched on the node after an in-place repair (docs/deploy.md).
    - name: state
      mountPath: /var/lib/fleetscope
      readOnly: true
    - name: tmp
      mountPath: /tmp
- name: npd
  image: {{ printf "%s:%s" .Values.nodeProblemDetector.image.repository .Values.nodeProblemDetector.image.tag }}
  imagePullPolicy: {{ .Values.nodeProblemDetector.image.pullPolicy }}
  command:
    - /node-problem-detector
    - --logtostderr
    - --config.custom-plugin-monitor=/config/fleetscope-monitor.json
    # The pod shares the host network: NPD's server on the loopback only, off NPD's default ports
    # (20256, 20257) that an NPD the cluster may already run holds; no Prometheus port.
    - --address=127.0.0.1
    - --port={{ .Values.nodeProblemDetector.healthPort }}
    - --prometheus-port=0
  env:
    - name: NODE_NAME
      valueFrom:
        fieldRef:
          fieldPath: spec.nodeName
    - name: FLEETSCOPE_VERDICTS
      value: /run/fleetscope/verdicts
  # NPD waits for the API server (up to 5 minutes) before it serves /healthz.
  startupProbe:
    httpGet:
      host: 127.0.0.1
      path: /healthz
      port: {{ .Values.nodeProblemDetector.healthPort }}
    periodSeconds: 10
    failureThreshold: 36
  readinessProbe:
    httpGet:
      host: 127.0.0.1
      path: /healthz
      port: {{ .Values.nodeProblemDetector.healthPort }}
    periodSeconds: 30
    timeoutSeconds: 5
  livenessProbe:
    httpGet:
      host: 127.0.0.1
      path: /healthz
      port: {{ .Values.nodeProblemDetector.healthPort }}
    periodSeconds: 30
    timeoutSeconds: 5
    failureThreshold: 3
  resources:
    {{- toYaml .Values.nodeProblemDetector.resources | nindent 4 }}
  securityContext:
    runAsUser: 65534
    runAsGroup: 65534
    privileged: false
    allowPrivilegeEscalation: false
    readOnlyRootFilesystem: true
    capabilities:
      drop: [ALL]
    seccompProfile:
      type: RuntimeDefault
  volumeMounts:
    - name: npd-config
      mountPath: /config/fleetscope-monitor.json
      subPath: fleetscope-monitor.json
      readOnly: true
    - name: npd-config
      mountPath: /opt/fleetscope-npd/verdict.sh
      subPath: verdict.sh
      readOnly: true
    - name: verdicts
      mountPath: /run/fleetscope/verdicts
      readOnly: true
    - name: npd-token
      mountPath: /var/run/secrets/kubernetes.io/serviceaccount
      readOnly: true
{{- end -}}
