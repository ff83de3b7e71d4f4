{{/* Names. */}}
{{- define "csi-sidecar.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "csi-sidecar.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "csi-sidecar.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "csi-sidecar.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end -}}

{{/* Selector labels; call with (dict "root" $ "component" "controller"). */}}
{{- define "csi-sidecar.selector" -}}
app.kubernetes.io/name: {{ include "csi-sidecar.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "csi-sidecar.controllerServiceAccount" -}}
{{- default (printf "%s-controller" (include "csi-sidecar.fullname" .)) .Values.serviceAccount.controller.name -}}
{{- end -}}

{{- define "csi-sidecar.nodeServiceAccount" -}}
{{- default (printf "%s-node" (include "csi-sidecar.fullname" .)) .Values.serviceAccount.node.name -}}
{{- end -}}

{{- define "csi-sidecar.image" -}}
{{- printf "%s:%s" .Values.image.repository .Values.image.tag -}}
{{- end -}}

{{- define "csi-sidecar.socket" -}}
{{- printf "/csi/%s" .Values.driver.socketName -}}
{{- end -}}

{{/* The leader-election flags of a controller module. */}}
{{- define "csi-sidecar.leaderArgs" -}}
{{- $le := .Values.controller.leaderElection -}}
{{- if $le.enabled }}
- --leader-election
{{- with $le.namespace }}
- --leader-election-namespace={{ . }}
{{- end }}
{{- with $le.leaseDuration }}
- --leader-election-lease-duration={{ . }}
{{- end }}
{{- with $le.renewDeadline }}
- --leader-election-renew-deadline={{ . }}
{{- end }}
{{- with $le.retryPeriod }}
- --leader-election-retry-period={{ . }}
{{- end }}
{{- if and $le.sharedLease (eq .Values.layout "combined") }}
- --leader-election-shared-lease={{ $le.sharedLease }}
{{- end }}
{{- end }}
{{- end -}}

{{/* An HTTP livenessProbe; call with (dict "path" ... "port" ... "probe" <values>). */}}
{{- define "csi-sidecar.httpProbe" -}}
httpGet:
  {{- with .host }}
  host: {{ . }}
  {{- end }}
  path: {{ .path }}
  port: {{ .port }}
initialDelaySeconds: {{ .probe.initialDelaySeconds }}
periodSeconds: {{ .probe.periodSeconds }}
timeoutSeconds: {{ .probe.timeoutSeconds }}
failureThreshold: {{ .probe.failureThreshold }}
{{- end -}}

{{/*
The CSI driver container; call with (dict "root" $ "side" "controller"|"node"
"probePort" <port number or 0> "probePath" <path>). The port is a number:
a probe's named port is looked up among its own container's ports, and
the prober's port belongs to csi-sidecar's container.
*/}}
{{- define "csi-sidecar.driverContainer" -}}
{{- $root := .root -}}
{{- $d := $root.Values.driver -}}
{{- $side := index $d .side -}}
- name: driver
  image: {{ $d.image }}
  imagePullPolicy: {{ $d.pullPolicy }}
  {{- if $d.socketUmask }}
  command:
    - /bin/sh
    - -c
    - {{ printf "umask %s && exec %s \"$@\"" $d.socketUmask $d.command | quote }}
    - {{ $d.command | quote }}
  {{- end }}
  {{- with $side.args }}
  args:
    {{- range . }}
    - {{ . | quote }}
    {{- end }}
  {{- end }}
  env:
    - name: CSI_ENDPOINT
      value: {{ printf "unix://%s" (include "csi-sidecar.socket" $root) | quote }}
    - name: KUBE_NODE_NAME
      valueFrom:
        fieldRef:
          fieldPath: spec.nodeName
    {{- with $side.env }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  {{- with $side.securityContext }}
  securityContext:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $side.resources }}
  resources:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- if .probePort }}
  livenessProbe:
    {{- include "csi-sidecar.httpProbe" (dict "path" .probePath "port" .probePort "host" $root.Values.httpBindAddress "probe" $d.livenessProbe) | nindent 4 }}
  {{- end }}
  volumeMounts:
    - name: socket-dir
      mountPath: /csi
    {{- if eq .side "node" }}
    - name: mountpoint-dir
      mountPath: {{ printf "%s/pods" $root.Values.node.kubeletDir }}
      mountPropagation: Bidirectional
    - name: plugins-dir
      mountPath: {{ printf "%s/plugins" $root.Values.node.kubeletDir }}
      mountPropagation: Bidirectional
    {{- end }}
    {{- with $side.extraVolumeMounts }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
{{- end -}}

{{/*
One csi-sidecar container; call with (dict "root" $ "pod" <controller|node
values> "name" ... "command" <"" or "/csi-provisioner"> "args" <list>
"ports" <list of (dict name port)> "probe" <"" or (dict path port)>
"env" <bool: POD_NAMESPACE> "registration" <bool>).
*/}}
{{- define "csi-sidecar.sidecarContainer" -}}
{{- $root := .root -}}
- name: {{ .name }}
  image: {{ include "csi-sidecar.image" $root }}
  imagePullPolicy: {{ $root.Values.image.pullPolicy }}
  {{- with .command }}
  command: [{{ . | quote }}]
  {{- end }}
  args:
    {{- range .args }}
    - {{ . | quote }}
    {{- end }}
  {{- if or .env $root.Values.extraEnv }}
  env:
  {{- end }}
  {{- if .env }}
    - name: POD_NAMESPACE
      valueFrom:
        fieldRef:
          fieldPath: metadata.namespace
    {{- if .capacity }}
    # Capacity tracking: where its objects live and the owner walk's start.
    - name: NAMESPACE
      valueFrom:
        fieldRef:
          fieldPath: metadata.namespace
    - name: POD_NAME
      valueFrom:
        fieldRef:
          fieldPath: metadata.name
    {{- end }}
  {{- end }}
  {{- with $root.Values.extraEnv }}
    {{- toYaml . | nindent 4 }}
  {{- end }}
  ports:
    {{- range .ports }}
    - name: {{ .name }}
      containerPort: {{ .port }}
      protocol: TCP
    {{- end }}
  {{- if .probe }}
  livenessProbe:
    {{- include "csi-sidecar.httpProbe" (dict "path" .probe.path "port" .probe.port "host" $root.Values.httpBindAddress "probe" .pod.livenessProbe) | nindent 4 }}
  {{- end }}
  {{- with .pod.resources }}
  resources:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .pod.securityContext }}
  securityContext:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  volumeMounts:
    - name: socket-dir
      mountPath: /csi
    {{- if .registration }}
    - name: registration-dir
      mountPath: /registration
    {{- end }}
    {{- if .tls }}
    - name: snapshot-metadata-tls
      mountPath: /tls
      readOnly: true
    {{- end }}
{{- end -}}

{{/* Pod-level scheduling and security fields of a pod's values. */}}
{{- define "csi-sidecar.podSpecCommon" -}}
{{- if .pod.hostNetwork }}
hostNetwork: true
dnsPolicy: ClusterFirstWithHostNet
{{- end }}
{{- with .pod.podSecurityContext }}
securityContext:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .root.Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .pod.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with .pod.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .pod.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .pod.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/*
Capacity-tracking flags of a module whose values block has `capacity` (the
provisioner's); call with that block. A YAML list, empty when off.
*/}}
{{/*
The snapshot-metadata module's server flags from its values block (only
that block has tlsSecret): the mounted key pair, the gRPC port, the
audience. A YAML list.
*/}}
{{- define "csi-sidecar.serverArgs" -}}
{{- if .tlsSecret -}}
- --tls-cert=/tls/tls.crt
- --tls-key=/tls/tls.key
- {{ printf "--port=%v" .grpcPort | quote }}
{{- with .audience }}
- {{ printf "--audience=%s" . | quote }}
{{- end }}
{{- else -}}
[]
{{- end -}}
{{- end }}

{{- define "csi-sidecar.capacityArgs" -}}
{{- $cap := .capacity -}}
{{- if and $cap $cap.enabled -}}
- --enable-capacity
- {{ printf "--capacity-ownerref-level=%v" $cap.ownerrefLevel | quote }}
{{- else -}}
[]
{{- end -}}
{{- end }}

{{/*
The rows of the module table one pod can run (files/modules.yaml, rendered
from src/modules/mod.rs: name, values key, drop-in container, command and
port name, whether it leads, whether it registers with the kubelet, its
rules); call with (dict "root" $ "pod" "controller"|"node"). A YAML list.
*/}}
{{- define "csi-sidecar.moduleRows" -}}
{{- $all := .root.Files.Get "files/modules.yaml" | fromYaml -}}
{{- toYaml (index $all .pod) -}}
{{- end }}

{{/*
The rows of one pod whose values block is enabled; call as
csi-sidecar.moduleRows. A YAML list.
*/}}
{{- define "csi-sidecar.enabledRows" -}}
{{- $m := (index .root.Values .pod).modules -}}
{{- $rows := list -}}
{{- range (include "csi-sidecar.moduleRows" . | fromYamlArray) -}}
{{- $v := index $m .values -}}
{{- if not $v -}}
{{- fail (printf "%s.modules.%s: no values block for module %s" $.pod .values .name) -}}
{{- end -}}
{{- if $v.enabled -}}
{{- $rows = append $rows . -}}
{{- end -}}
{{- end -}}
{{- toYaml $rows -}}
{{- end }}

{{/*
"true" when the controller pod runs a module that leads (a controller,
with the Kubernetes API, a Lease and RBAC), else "".
*/}}
{{- define "csi-sidecar.controllersEnabled" -}}
{{- range (include "csi-sidecar.enabledRows" (dict "root" . "pod" "controller") | fromYamlArray) -}}
{{- if .leader -}}true{{- end -}}
{{- end -}}
{{- end }}
