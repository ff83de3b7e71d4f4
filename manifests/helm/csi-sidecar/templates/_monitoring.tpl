{{/*
The PromQL label matchers of this release's series (monitoring.selector,
or the job of this chart's ServiceMonitor and PodMonitor targets).
*/}}
{{- define "csi-sidecar.monitoringSelector" -}}
{{- default (printf "job=~\".*%s.*\"" (include "csi-sidecar.fullname" .)) .Values.monitoring.selector -}}
{{- end -}}

{{/*
The ports serving /metrics of one pod's csi-sidecar containers, as a YAML
list of (name, port) (the containers' port names: controller.yaml,
node.yaml); call with (dict "root" $ "component" "controller"|"node").
Empty when the pod is not rendered.
*/}}
{{- define "csi-sidecar.metricsPorts" -}}
{{- $v := .root.Values -}}
{{- $pod := index $v .component -}}
{{- $m := $pod.modules -}}
{{- $ports := list -}}
{{- if and $v.workloads $pod.enabled -}}
{{- if eq $v.layout "combined" -}}
{{- $ports = append $ports (dict "name" "healthz" "port" $pod.httpPort) -}}
{{- else -}}
{{- range (include "csi-sidecar.enabledRows" (dict "root" .root "pod" .component) | fromYamlArray) -}}
{{- $ports = append $ports (dict "name" .portName "port" (index $m .values).port) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- toYaml $ports -}}
{{- end -}}

{{/* The port names of both pods' metrics ports, without repeats (a YAML list). */}}
{{- define "csi-sidecar.metricsPortNames" -}}
{{- $names := list -}}
{{- range (list "controller" "node") -}}
{{- range (include "csi-sidecar.metricsPorts" (dict "root" $ "component" .) | fromYamlArray) -}}
{{- $names = append $names .name -}}
{{- end -}}
{{- end -}}
{{- toYaml (uniq $names) -}}
{{- end -}}
