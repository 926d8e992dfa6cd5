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

{{/*
vhostmq.checkUplink refuses uplink values that cannot work, naming the value.
*/}}
{{- define "vhostmq.checkUplink" -}}
{{- if not (or .Values.devicePlugin.enabled .Values.dra.enabled) -}}
{{- fail "devicePlugin.enabled, dra.enabled: at least one must be true (pods get queue slots through one of them)" -}}
{{- end -}}
{{- if and .Values.webhook.enabled (not .Values.devicePlugin.enabled) -}}
{{- fail "webhook.enabled: the webhook asks for the device plugin's vhostmq.io/queue-pairs, and devicePlugin.enabled is false (turn the webhook off; DRA pods carry their claims)" -}}
{{- end -}}
{{- if and .Values.dra.enabled (semverCompare "<1.34-0" .Capabilities.KubeVersion.Version) -}}
{{- fail (printf "dra.enabled: needs Kubernetes 1.34 or later (resource.k8s.io/v1); this is %s" .Capabilities.KubeVersion.Version) -}}
{{- end -}}
{{- if and .Values.dra.enabled (eq .Values.dra.devices "numa") (semverCompare "<1.36-0" .Capabilities.KubeVersion.Version) -}}
{{- fail (printf "dra.devices: numa needs Kubernetes 1.36 or later (consumable capacity, DRAConsumableCapacity on by default); this is %s" .Capabilities.KubeVersion.Version) -}}
{{- end -}}
{{- $u := .Values.uplink -}}
{{- $n := .Values.networkAttachmentDefinition -}}
{{- if and (eq $u.mode "af_xdp") (not $u.af_xdp.interface) -}}
{{- fail "uplink.af_xdp.interface: required with uplink.mode=af_xdp (the NIC the AF_XDP sockets bind to)" -}}
{{- end -}}
{{- if and $n.create (ne ($n.uplink | default "none") "none") (ne $n.uplink $u.mode) -}}
{{- fail (printf "networkAttachmentDefinition.uplink: %q needs uplink.mode=%s (uplink.mode is %q)" $n.uplink $n.uplink $u.mode) -}}
{{- end -}}
{{- if and $n.create (gt (int ($n.vlan | default 0)) 0) (eq ($n.uplink | default "none") "none") -}}
{{- fail "networkAttachmentDefinition.vlan: a VLAN needs an uplink (networkAttachmentDefinition.uplink tap or af_xdp)" -}}
{{- end -}}
{{- if and $n.create (eq $u.mode "tap") (eq $n.uplink "tap") (gt (int ($n.mtu | default 1500)) (int ($u.tap.mtu | default 1500))) -}}
{{- fail (printf "networkAttachmentDefinition.mtu: %d does not fit the tap uplink (uplink.tap.mtu %d)" (int $n.mtu) (int $u.tap.mtu)) -}}
{{- end -}}
{{- if and $n.create (eq $u.mode "af_xdp") (eq $n.uplink "af_xdp") (gt (int ($n.mtu | default 1500)) 3822) -}}
{{- fail (printf "networkAttachmentDefinition.mtu: %d does not fit the af_xdp uplink (frames up to 3840 bytes: MTU at most 3822)" (int $n.mtu)) -}}
{{- end -}}
{{- end -}}

{{/*
Scrape settings of the chart's monitors: the series' own namespace/pod
labels (the VM's pod) win over the target's, and the node's name is
`node`, which the alerts join on.
*/}}
{{- define "vhostmq.scrapeLabels" -}}
honorLabels: true
relabelings:
  - sourceLabels: [__meta_kubernetes_pod_node_name]
    targetLabel: node
{{- end -}}
