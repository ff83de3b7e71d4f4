{{/*
The alerting rules: the one source of the PrometheusRule
(prometheusrule.yaml) and the plain rules file (rules-configmap.yaml). A
Prometheus rules file (groups); {{`{{ $labels.x }}`}} and {{`{{ $value }}`}}
are Prometheus' own template fields, escaped from Helm.
*/}}
{{- define "csi-sidecar.rules" -}}
{{- $a := .Values.monitoring.alerts -}}
{{- $sel := include "csi-sidecar.monitoringSelector" . -}}
{{- $c := .Values.controller -}}
{{- $kube := include "csi-sidecar.controllersEnabled" . -}}
{{- $leader := and $a.noLeader.enabled $c.enabled $c.leaderElection.enabled $kube -}}
{{- if not (or $a.csiErrors.enabled $a.objectWaiting.enabled $a.queueNotDraining.enabled $leader $a.driverUnreachable.enabled) }}
{{- fail "monitoring.prometheusRule / monitoring.rulesConfigMap: every alert of monitoring.alerts is disabled" }}
{{- end -}}
groups:
  - name: csi-sidecar
    rules:
      {{- if $a.csiErrors.enabled }}
      - alert: CsiSidecarCsiErrors
        expr: |-
          100 * sum by (driver_name, method_name) (rate(csi_sidecar_operations_seconds_count{ {{- $sel }},grpc_status_code!="OK"}[5m]))
            / sum by (driver_name, method_name) (rate(csi_sidecar_operations_seconds_count{ {{- $sel -}} }[5m]))
            > {{ $a.csiErrors.percent }}
          and sum by (driver_name, method_name) (rate(csi_sidecar_operations_seconds_count{ {{- $sel -}} }[5m])) * 60
            >= {{ $a.csiErrors.minCallsPerMinute }}
        for: {{ $a.csiErrors.for }}
        labels:
          severity: {{ $a.csiErrors.severity }}
          {{- with $a.labels }}
          {{- toYaml . | nindent 10 }}
          {{- end }}
        annotations:
          summary: {{ `CSI {{ $labels.method_name }} calls to {{ $labels.driver_name }} fail` | quote }}
          description: {{ printf "{{ $value | humanize }}%% of the {{ $labels.method_name }} calls csi-sidecar made to the CSI driver {{ $labels.driver_name }} in the last 5 minutes ended with a gRPC status other than OK (alerting above %v%% for %s)." $a.csiErrors.percent $a.csiErrors.for | quote }}
      {{- end }}
      {{- if $a.objectWaiting.enabled }}
      - alert: CsiSidecarObjectWaiting
        expr: |-
          max without (waiting_for) (csi_sidecar_object_longest_wait_seconds{ {{- $sel }}
          {{- with $a.objectWaiting.ignoreWaitingFor -}} ,waiting_for!~"{{ join "|" . }}" {{- end -}} })
            > {{ mul $a.objectWaiting.minutes 60 }}
        for: {{ $a.objectWaiting.for }}
        labels:
          severity: {{ $a.objectWaiting.severity }}
          {{- with $a.labels }}
          {{- toYaml . | nindent 10 }}
          {{- end }}
        annotations:
          summary: {{ `An object of csi-sidecar's {{ $labels.module }} module has waited {{ $value | humanizeDuration }}` | quote }}
          description: {{ printf "The {{ $labels.module }} module of csi-sidecar {{ $labels.instance }} has an object that has waited {{ $value | humanizeDuration }} (alerting above %v minutes); csi_sidecar_objects_waiting{module=\"{{ $labels.module }}\"} tells what it waits for." $a.objectWaiting.minutes | quote }}
      {{- end }}
      {{- if $a.queueNotDraining.enabled }}
      - alert: CsiSidecarQueueNotDraining
        expr: |-
          csi_sidecar_workqueue_oldest_item_age_seconds{ {{- $sel -}} } > {{ mul $a.queueNotDraining.minutes 60 }}
            and workqueue_depth{ {{- $sel -}} } > 0
        for: {{ $a.queueNotDraining.for }}
        labels:
          severity: {{ $a.queueNotDraining.severity }}
          {{- with $a.labels }}
          {{- toYaml . | nindent 10 }}
          {{- end }}
        annotations:
          summary: {{ `Work queue {{ $labels.name }} of csi-sidecar is not draining` | quote }}
          description: {{ printf "The oldest key in work queue {{ $labels.name }} of csi-sidecar {{ $labels.instance }} has waited {{ $value | humanizeDuration }} while the queue holds keys (alerting above %v minutes): its workers are stuck or too few." $a.queueNotDraining.minutes | quote }}
      {{- end }}
      {{- if $leader }}
      - alert: CsiSidecarNoLeader
        expr: |-
          max by (name) (leader_election_master_status{ {{- $sel -}} }) == 0
        for: {{ $a.noLeader.for }}
        labels:
          severity: {{ $a.noLeader.severity }}
          {{- with $a.labels }}
          {{- toYaml . | nindent 10 }}
          {{- end }}
        annotations:
          summary: {{ `No csi-sidecar replica leads Lease {{ $labels.name }}` | quote }}
          description: {{ printf "Every csi-sidecar replica that reports Lease {{ $labels.name }} is a standby, for %s: the module of that Lease does no work." $a.noLeader.for | quote }}
      {{- end }}
      {{- if $a.driverUnreachable.enabled }}
      - alert: CsiSidecarDriverUnreachable
        expr: |-
          csi_sidecar_driver_connected{ {{- $sel -}} } == 0
        for: {{ $a.driverUnreachable.for }}
        labels:
          severity: {{ $a.driverUnreachable.severity }}
          {{- with $a.labels }}
          {{- toYaml . | nindent 10 }}
          {{- end }}
        annotations:
          summary: {{ `csi-sidecar {{ $labels.instance }} cannot reach its CSI driver` | quote }}
          description: {{ printf "csi-sidecar {{ $labels.instance }} has had no connection to its CSI driver's socket for %s: no CSI call of that pod succeeds." $a.driverUnreachable.for | quote }}
      {{- end }}
{{- end -}}
