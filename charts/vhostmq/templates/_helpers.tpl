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
{{- if and $n.create (eq ($n.uplink | default "none") "vxlan") (not $n.vni) -}}
{{- fail "networkAttachmentDefinition.vni: required with networkAttachmentDefinition.uplink=vxlan (1..16777215, the same network on every node)" -}}
{{- end -}}
{{- if and $n.create $n.vni (ne ($n.uplink | default "none") "vxlan") -}}
{{- fail "networkAttachmentDefinition.vni: a VNI is for networkAttachmentDefinition.uplink=vxlan" -}}
{{- end -}}
{{- if and $n.create (eq ($n.uplink | default "none") "vxlan") (gt (int ($n.vlan | default 0)) 0) -}}
{{- fail "networkAttachmentDefinition.vlan: on the vxlan uplink a network is told apart by its vni, not a VLAN" -}}
{{- end -}}
{{- if and $n.create (eq $u.mode "vxlan") (eq $n.uplink "vxlan") (gt (int ($n.mtu | default 1500)) (sub (int ($u.vxlan.mtu | default 1500)) 50)) -}}
{{- fail (printf "networkAttachmentDefinition.mtu: %d does not fit the vxlan uplink (uplink.vxlan.mtu %d less 50: at most %d)" (int $n.mtu) (int $u.vxlan.mtu) (sub (int $u.vxlan.mtu) 50)) -}}
{{- end -}}
{{- if and (eq $u.mode "vxlan") (not $u.vxlan.nodes) (not $u.vxlan.vteps) -}}
{{- fail "uplink.vxlan.vteps: required when uplink.vxlan.nodes is false (the other nodes' underlay addresses)" -}}
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

{{/*
vhostmq.metricsBind is metrics.bind with auto resolved: localhost when the
node pod is in the host network (an uplink: the pod IP is the node's,
which guests reach over it), else podIP.
*/}}
{{- define "vhostmq.metricsBind" -}}
{{- $b := .Values.metrics.bind | default "auto" -}}
{{- if eq $b "auto" -}}
{{- if eq (.Values.uplink.mode | default "none") "none" }}podIP{{ else }}localhost{{ end -}}
{{- else -}}
{{ $b }}
{{- end -}}
{{- end -}}

{{/*
vhostmq.checkMetrics refuses metrics values that cannot work together,
naming the value.
*/}}
{{- define "vhostmq.checkMetrics" -}}
{{- $m := .Values.metrics -}}
{{- if $m.enabled -}}
{{- $bind := include "vhostmq.metricsBind" . -}}
{{- $auth := $m.auth | default "none" -}}
{{- if and (eq $bind "localhost") (or $m.serviceMonitor.enabled $m.podMonitor.enabled $m.scrapeAnnotations) -}}
{{- fail (printf "metrics.bind: %q resolves to localhost (uplink.mode %q runs the pod in the host network), which no scraper reaches; set metrics.bind=podIP or all (with metrics.auth kubernetes or tls) for serviceMonitor, podMonitor or scrapeAnnotations" ($m.bind | default "auto") .Values.uplink.mode) -}}
{{- end -}}
{{- if and (eq $auth "tls") (not $m.tls.secretName) -}}
{{- fail "metrics.tls.secretName: required with metrics.auth=tls (a kubernetes.io/tls Secret in the release's namespace)" -}}
{{- end -}}
{{- if and $m.tls.secretName (eq $auth "none") -}}
{{- fail (printf "metrics.tls.secretName: %q needs metrics.auth tls or kubernetes" $m.tls.secretName) -}}
{{- end -}}
{{- if and $m.tls.clientCASecretName (ne $auth "tls") -}}
{{- fail (printf "metrics.tls.clientCASecretName: %q only with metrics.auth=tls (metrics.auth is %q)" $m.tls.clientCASecretName $auth) -}}
{{- end -}}
{{- if and $m.readers (ne $auth "kubernetes") -}}
{{- fail (printf "metrics.readers: only with metrics.auth=kubernetes (metrics.auth is %q)" $auth) -}}
{{- end -}}
{{- if and (eq $auth "kubernetes") $m.podMonitor.enabled (not $m.podMonitor.authorization) -}}
{{- fail "metrics.podMonitor.authorization: required with metrics.auth=kubernetes (a PodMonitor cannot send Prometheus' own token; or use metrics.serviceMonitor)" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
vhostmq.webhookMatch is the CEL expression of the pods the webhook sees:
a networks annotation naming one of the vhostmq NADs (by name, in any
namespace: a superset), or a container running the binding sidecar.
*/}}
{{- define "vhostmq.webhookMatch" -}}
{{- $names := .Values.webhook.networkNames | default list -}}
{{- if .Values.networkAttachmentDefinition.create -}}
{{- $names = append $names .Values.networkAttachmentDefinition.name -}}
{{- end -}}
{{- if not $names -}}
{{- fail "webhook.networkNames: empty, and networkAttachmentDefinition.create is false: name the NADs whose pods the webhook must see (or [\"*\"] for every pod with networks)" -}}
{{- end -}}
{{- $has := "has(object.metadata.annotations) && 'k8s.v1.cni.cncf.io/networks' in object.metadata.annotations" -}}
{{- if has "*" $names -}}
{{ $has }}
{{- else -}}
{{- $quoted := list -}}
{{- range uniq $names }}{{ $quoted = append $quoted (regexQuoteMeta .) }}{{ end -}}
{{ $has }} && (object.metadata.annotations['k8s.v1.cni.cncf.io/networks'].matches(r'(^|[\s,/"])({{ join "|" $quoted }})([\s,@"]|$)') || object.spec.containers.exists(c, c.image == '{{ include "vhostmq.sidecarImage" . }}'))
{{- end -}}
{{- end -}}
