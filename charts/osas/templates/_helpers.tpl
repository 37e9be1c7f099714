{{/* The chart's name, or nameOverride. */}}
{{- define "osas.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Objects' name: fullnameOverride, else the release name (with the chart's name appended
unless the release name holds it already). The Service, hence the host CA dials, has it. */}}
{{- define "osas.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "osas.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "osas.selectorLabels" -}}
app.kubernetes.io/name: {{ include "osas.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "osas.labels" -}}
helm.sh/chart: {{ include "osas.chart" . }}
{{ include "osas.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: osas
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* The labels of the helm test pod, which the NetworkPolicy lets through. */}}
{{- define "osas.testLabels" -}}
app.kubernetes.io/name: {{ include "osas.name" . }}-test
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: test
{{- end }}

{{- define "osas.image" -}}
{{- if not .Values.image.repository }}
{{- fail "image.repository is not set: osas publishes no image. Build it from the repository's Containerfile, push it to a registry your cluster pulls from, and set image.repository (and image.tag or image.digest): docs/install.md, \"The image\"" }}
{{- end }}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}
{{- end }}

{{- define "osas.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "osas.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The port of a "host:port" address ("[::]:8086" too). */}}
{{- define "osas.port" -}}
{{- regexReplaceAll "^.*:([0-9]+)$" . "${1}" }}
{{- end }}

{{- define "osas.grpcPort" -}}
{{- include "osas.port" (required "config.listen is required" .Values.config.listen) }}
{{- end }}

{{- define "osas.healthPort" -}}
{{- include "osas.port" (required "config.health_listen is required" .Values.config.health_listen) }}
{{- end }}

{{/* Empty when metrics are off (config.metrics_listen null). */}}
{{- define "osas.metricsPort" -}}
{{- with .Values.config.metrics_listen }}{{ include "osas.port" . }}{{ end }}
{{- end }}

{{/* The host CA dials: the Service's name in the cluster. */}}
{{- define "osas.serviceHost" -}}
{{ include "osas.fullname" . }}.{{ .Release.Namespace }}.svc
{{- end }}

{{- define "osas.tlsSecretName" -}}
{{- if .Values.tls.certManager.enabled }}
{{- printf "%s-tls" (include "osas.fullname" .) }}
{{- else }}
{{- required "tls.existingSecret is required when tls.certManager.enabled is false: a Secret with osas's server certificate (tls.crt, tls.key) and the CA that signs CA's client certificate (ca.crt)" .Values.tls.existingSecret }}
{{- end }}
{{- end }}

{{- define "osas.clientSecretName" -}}
{{- default (printf "%s-client" (include "osas.fullname" .)) .Values.tls.clientSecret }}
{{- end }}

{{- define "osas.clientDnsName" -}}
{{- default (printf "cluster-autoscaler.%s.svc" .Release.Namespace) .Values.tls.clientDnsName }}
{{- end }}

{{- define "osas.cloudConfigSecretName" -}}
{{- printf "%s-ca-cloud-config" (include "osas.fullname" .) }}
{{- end }}

{{/* Where the main OpenStack credentials come from: "created", "existing", or "none" where
config.openstack.cloud is a cloud of credentials.clouds (every place then reads a Secret of
its own). */}}
{{- define "osas.credentialsSource" -}}
{{- $c := .Values.credentials }}
{{- $top := default "" (default (dict) .Values.config.openstack).cloud }}
{{- if and $c.cloudsYaml $c.env }}
{{- fail "credentials: give cloudsYaml or env, not both" }}
{{- else if or $c.cloudsYaml $c.env }}created
{{- else if $c.existingSecret }}existing
{{- else if hasKey (include "osas.ownClouds" . | fromJson) (toString $top) }}none
{{- else }}
{{- fail "credentials: give existingSecret (a Secret you made), cloudsYaml or env; or, to keep every cloud's credentials in a Secret of its own, name in config.openstack.cloud a cloud of credentials.clouds" }}
{{- end }}
{{- end }}

{{- define "osas.credentialsSecretName" -}}
{{- if eq (include "osas.credentialsSource" .) "created" }}
{{- printf "%s-openstack" (include "osas.fullname" .) }}
{{- else }}
{{- .Values.credentials.existingSecret }}
{{- end }}
{{- end }}

{{/* "cloudsYaml", "env", or "none" (no main Secret: credentialsSource). */}}
{{- define "osas.credentialsFormat" -}}
{{- $c := .Values.credentials }}
{{- if $c.cloudsYaml }}cloudsYaml
{{- else if $c.env }}env
{{- else if eq (include "osas.credentialsSource" .) "none" }}none
{{- else }}{{ $c.existingSecretFormat }}
{{- end }}
{{- end }}

{{/* The folder a cloud of credentials.clouds is mounted at: beside /etc/openstack, not in it,
as a mount point inside a read-only Secret volume must be made in that volume (kubelet does;
some sandboxed runtimes fail the container). */}}
{{- define "osas.cloudFolder" -}}
/etc/openstack-clouds/{{ . }}
{{- end }}

{{/* credentials.clouds, checked: cloud name -> {secretName, volume}. Each such cloud's
credentials are a Secret of their own, mounted as a folder that osas reads the cloud from
alone (clouds_file): no grant on Secrets is needed, and kubelet's updates are seen. */}}
{{- define "osas.ownClouds" -}}
{{- $clouds := dict }}
{{- range $index, $cloud := .Values.credentials.clouds }}
{{- $where := printf "credentials.clouds[%d](%s)" $index $cloud.name }}
{{- if hasKey $clouds $cloud.name }}
{{- fail (printf "credentials.clouds: the cloud '%s' is given twice: one Secret per cloud" $cloud.name) }}
{{- end }}
{{- $secretName := "" }}
{{- if and $cloud.existingSecret $cloud.cloudsYaml }}
{{- fail (printf "%s: give existingSecret or cloudsYaml, not both" $where) }}
{{- else if $cloud.existingSecret }}
{{- $secretName = $cloud.existingSecret }}
{{- else if $cloud.cloudsYaml }}
{{- /* osas would find no such cloud at its start: say so now, naming keys only. */}}
{{- $parsed := $cloud.cloudsYaml }}
{{- if kindIs "string" $parsed }}
{{- $parsed = fromYaml $parsed }}
{{- if hasKey $parsed "Error" }}
{{- fail (printf "%s: cloudsYaml is not a YAML mapping" $where) }}
{{- end }}
{{- end }}
{{- $entries := get $parsed "clouds" }}
{{- if not (and (kindIs "map" $entries) (hasKey $entries $cloud.name)) }}
{{- fail (printf "%s: cloudsYaml has no cloud '%s' under `clouds:`: osas reads that entry from this clouds.yaml alone" $where $cloud.name) }}
{{- end }}
{{- $secretName = printf "%s-openstack-%s" (include "osas.fullname" $) $cloud.name }}
{{- else }}
{{- fail (printf "%s: give existingSecret (a Secret with the key clouds.yaml) or cloudsYaml" $where) }}
{{- end }}
{{- $_ := set $clouds $cloud.name (dict "secretName" $secretName "volume" (printf "cloud-%s" $cloud.name)) }}
{{- end }}
{{- toJson $clouds }}
{{- end }}

{{/* The clouds.yaml osas reads the cloud `name` from when it is one of credentials.clouds
(ownClouds, as JSON), else "". */}}
{{- define "osas.cloudsFile" -}}
{{- if and .name (hasKey .own .name) }}{{ include "osas.cloudFolder" .name }}/clouds.yaml{{ end }}
{{- end }}

{{/* osas's configuration file as the chart completes it. */}}
{{- define "osas.config" -}}
{{- include "osas.configChecks" . }}
{{- $config := deepCopy .Values.config }}
{{- $openstack := default (dict) $config.openstack }}
{{- if hasKey $openstack "auth" }}
{{- fail "config.openstack.auth would put OpenStack credentials in a ConfigMap in plain text: put them in a Secret instead (credentials.cloudsYaml, credentials.env or credentials.existingSecret; docs/install.md)" }}
{{- end }}
{{- $own := include "osas.ownClouds" . | fromJson }}
{{- $format := include "osas.credentialsFormat" . }}
{{- if hasKey $openstack "clouds_file" }}
{{- fail "config.openstack.clouds_file is set by the chart, which owns the pod's mount paths: give the cloud's clouds.yaml a Secret of its own in credentials.clouds (the chart mounts it and names it here), or use the main credentials; remove it" }}
{{- end }}
{{- if eq $format "env" }}
{{- if and $openstack.cloud (not (hasKey $own (toString $openstack.cloud))) }}
{{- fail "config.openstack.cloud names a clouds.yaml entry, but the credentials are OS_* variables (credentials.env or existingSecretFormat: env): remove config.openstack.cloud, or give that cloud a Secret of its own in credentials.clouds" }}
{{- end }}
{{- else if not $openstack.cloud }}
{{- /* A clouds.yaml names its clouds: without a name openstacksdk would not pick one. */}}
{{- $_ := set $openstack "cloud" "openstack" }}
{{- end }}
{{- with include "osas.cloudsFile" (dict "name" $openstack.cloud "own" $own) }}
{{- $_ := set $openstack "clouds_file" . }}
{{- end }}
{{- $_ := set $config "openstack" $openstack }}
{{- $userTls := default (dict) $config.tls }}
{{- $serverNames := concat (list (include "osas.serviceHost" .)) (default (list) $userTls.server_names) | uniq }}
{{- $allowed := $userTls.allowed_clients }}
{{- if not $allowed }}
{{- $allowed = list (printf "dns:%s" (include "osas.clientDnsName" .)) }}
{{- end }}
{{- $_ := set $config "tls" (dict
  "cert_file" "/etc/osas/tls/tls.crt"
  "key_file" "/etc/osas/tls/tls.key"
  "client_ca_file" "/etc/osas/tls/ca.crt"
  "server_names" $serverNames
  "allowed_clients" $allowed) }}
{{- if not $config.metrics_listen }}
{{- $_ := unset $config "metrics_listen" }}
{{- end }}
{{- $groups := list }}
{{- range $index, $given := $config.node_groups }}
{{- $group := deepCopy $given }}
{{- with $group.openstack }}
{{- $where := printf "config.node_groups[%d](%s).openstack" $index $group.id }}
{{- if hasKey . "clouds_file" }}
{{- fail (printf "%s.clouds_file is set by the chart, which owns the pod's mount paths: give the cloud's clouds.yaml a Secret of its own in credentials.clouds (the chart mounts it and names it for every group of that cloud); remove it" $where) }}
{{- end }}
{{- $cloudsFile := include "osas.cloudsFile" (dict "name" .cloud "own" $own) }}
{{- if $cloudsFile }}
{{- $_ := set . "clouds_file" $cloudsFile }}
{{- else if and .cloud (ne $format "cloudsYaml") }}
{{- /* Without a main clouds.yaml only a cloud of credentials.clouds can be found. */}}
{{- $main := ternary "the main credentials are OS_* variables" "there are no main credentials" (eq $format "env") }}
{{- fail (printf "%s.cloud '%s' is not a cloud of credentials.clouds, and %s, so no clouds.yaml holds it: give that cloud a Secret of its own in credentials.clouds" $where (toString .cloud) $main) }}
{{- end }}
{{- end }}
{{- $labels := default (dict) $group.labels }}
{{- if not (hasKey $labels $.Values.managedNodes.label) }}
{{- $_ := set $labels $.Values.managedNodes.label $group.id }}
{{- end }}
{{- $_ := set $group "labels" $labels }}
{{- $groups = append $groups $group }}
{{- end }}
{{- $_ := set $config "node_groups" $groups }}
{{- $_ := set $config "leader_election" (include "osas.leaderElection" . | fromYaml) }}
{{- toYaml $config }}
{{- end }}

{{/* "true" when osas elects its writer through the Lease (the chart's default), else "". */}}
{{- define "osas.electionEnabled" -}}
{{- $election := default (dict) .Values.config.leader_election }}
{{- if or (not (hasKey $election "enabled")) $election.enabled }}true{{ end }}
{{- end }}

{{/* "true" when a node group mints a join token per server (bootstrap_token): osas then creates
Secrets in kube-system, held by the admission policy to kubeadm bootstrap tokens. */}}
{{- define "osas.mintsJoinTokens" -}}
{{- range .Values.config.node_groups }}{{ if not (kindIs "invalid" .bootstrap_token) }}true{{ end }}{{ end }}
{{- end }}

{{/* The Lease the replicas compete for, as osas names it: lease_name, else osas-<cluster_name>.
Per cluster, not per release: any copy of osas for this cluster competes for it. */}}
{{- define "osas.leaseName" -}}
{{- $election := default (dict) .Values.config.leader_election }}
{{- default (printf "osas-%s" .Values.config.cluster_name) $election.lease_name }}
{{- end }}

{{/* osas's default, kept in step with it: the Lease's namespace is fixed, never the release's. */}}
{{- define "osas.leaseNamespace" -}}
{{- $election := default (dict) .Values.config.leader_election }}
{{- default "kube-system" $election.lease_namespace }}
{{- end }}

{{/* The EndpointSlice the Lease holder writes: the only endpoint of the Service CA dials. */}}
{{- define "osas.leaderSliceName" -}}
{{- printf "%s-leader" (include "osas.fullname" .) }}
{{- end }}

{{/* config.leader_election as the chart completes it: on (one writer among the replicas), the
Service CA dials as the one whose endpoint the holder publishes. The user's durations, lease
name and namespace are kept; what only the chart can know is refused. */}}
{{- define "osas.leaderElection" -}}
{{- $election := deepCopy (default (dict) .Values.config.leader_election) }}
{{- if hasKey $election "service_name" }}
{{- fail (printf "config.leader_election.service_name is set by the chart: it is the Service CA dials (%s), whose only endpoint the Lease holder publishes; remove it" (include "osas.fullname" .)) }}
{{- end }}
{{- if hasKey $election "kubeconfig" }}
{{- fail "config.leader_election.kubeconfig is set by the chart: osas reaches the Kubernetes API with its pod's service account (rbac.create gives it the Lease and the EndpointSlice); remove it" }}
{{- end }}
{{- if $election.identity }}
{{- fail "config.leader_election.identity would give every replica the same name on the Lease, so that each would take the other's renewals for its own: remove it (osas uses the pod's name, POD_NAME)" }}
{{- end }}
{{- if and $election.service_namespace (ne $election.service_namespace .Release.Namespace) }}
{{- fail (printf "config.leader_election.service_namespace must be the release's namespace (%s), where the chart makes the Service CA dials and lets osas write its EndpointSlice; remove it" .Release.Namespace) }}
{{- end }}
{{- if include "osas.electionEnabled" . }}
{{- $_ := set $election "enabled" true }}
{{- $_ := set $election "service_name" (include "osas.fullname" .) }}
{{- else if gt (int .Values.replicaCount) 1 }}
{{- fail (printf "config.leader_election.enabled is false with replicaCount %d: every replica would act on every scale-up (two writers). Keep leader election on, or set replicaCount: 1" (int .Values.replicaCount)) }}
{{- end }}
{{- toYaml $election }}
{{- end }}

{{/* CA's cloud-config (--cloud-config), as CA's externalgrpc client reads it. */}}
{{- define "osas.caCloudConfig" -}}
address: {{ include "osas.serviceHost" . }}:{{ include "osas.grpcPort" . }}
cert: {{ .Values.clusterAutoscaler.tlsMountPath }}/tls.crt
key: {{ .Values.clusterAutoscaler.tlsMountPath }}/tls.key
cacert: {{ .Values.clusterAutoscaler.tlsMountPath }}/ca.crt
grpc_timeout: {{ .Values.clusterAutoscaler.grpcTimeout }}
{{- end }}

{{/* The issuer of the server and client certificates. */}}
{{- define "osas.issuerRef" -}}
{{- if .Values.tls.certManager.issuerRef.name }}
{{- toYaml .Values.tls.certManager.issuerRef }}
{{- else -}}
name: {{ include "osas.fullname" . }}-ca
kind: Issuer
group: cert-manager.io
{{- end }}
{{- end }}

{{/* .Values.affinity, with every required node selector term also asking for nodes that do
not carry managedNodes.label: osas never runs on a node it may delete. */}}
{{- define "osas.affinity" -}}
{{- $affinity := deepCopy (default (dict) .Values.affinity) }}
{{- if .Values.managedNodes.avoid }}
{{- $avoid := dict "key" .Values.managedNodes.label "operator" "DoesNotExist" }}
{{- $node := default (dict) $affinity.nodeAffinity }}
{{- $required := default (dict) $node.requiredDuringSchedulingIgnoredDuringExecution }}
{{- $terms := list }}
{{- range default (list (dict)) $required.nodeSelectorTerms }}
{{- $term := deepCopy . }}
{{- $_ := set $term "matchExpressions" (append (default (list) $term.matchExpressions) $avoid) }}
{{- $terms = append $terms $term }}
{{- end }}
{{- $_ := set $required "nodeSelectorTerms" $terms }}
{{- $_ := set $node "requiredDuringSchedulingIgnoredDuringExecution" $required }}
{{- $_ := set $affinity "nodeAffinity" $node }}
{{- end }}
{{- if $affinity }}{{ toYaml $affinity }}{{ end }}
{{- end }}

{{/* .Values.topologySpreadConstraints, and a soft spread of the replicas over
replicaSpread.topologyKey (nodes by default) unless one of those already uses that key: the
loss of a node takes the writer or its standby, not both. Empty when there is none. */}}
{{- define "osas.topologySpread" -}}
{{- $constraints := deepCopy (default (list) .Values.topologySpreadConstraints) }}
{{- $spread := .Values.replicaSpread }}
{{- if $spread.enabled }}
{{- $taken := false }}
{{- range $constraints }}
{{- if eq .topologyKey $spread.topologyKey }}{{ $taken = true }}{{ end }}
{{- end }}
{{- if not $taken }}
{{- $constraints = append $constraints (dict
  "maxSkew" (int $spread.maxSkew)
  "topologyKey" $spread.topologyKey
  "whenUnsatisfiable" "ScheduleAnyway"
  "labelSelector" (dict "matchLabels" (include "osas.selectorLabels" . | fromYaml))) }}
{{- end }}
{{- end }}
{{- if $constraints }}{{ toYaml $constraints }}{{ end }}
{{- end }}

{{/* A duration of osas's configuration in seconds: a number as it is, a text ("90", "1h30m")
by osas's own pattern (_config_defaults.tpl). The schema has checked its form already. */}}
{{- define "osas.seconds" -}}
{{- if kindIs "string" . }}
{{- $pattern := include "osas.durationPattern" nil }}
{{- $plain := regexReplaceAll $pattern . "${1}" | float64 }}
{{- $hours := regexReplaceAll $pattern . "${2}" | float64 }}
{{- $minutes := regexReplaceAll $pattern . "${3}" | float64 }}
{{- $seconds := regexReplaceAll $pattern . "${4}" | float64 }}
{{- addf $plain (mulf $hours 3600) (mulf $minutes 60) $seconds }}
{{- else }}
{{- float64 . }}
{{- end }}
{{- end }}

{{/* A block of config with osas's defaults (_config_defaults.tpl) for the keys left out. */}}
{{- define "osas.withDefaults" -}}
{{- $block := deepCopy (index (include "osas.configDefaults" nil | fromJson) .name) }}
{{- range $key, $value := default (dict) .given }}
{{- $_ := set $block $key $value }}
{{- end }}
{{- toJson $block }}
{{- end }}

{{/* osas's checks across keys (osas/config/schema.py), which a JSON schema cannot state, in
osas's words: what the schema lets through and osas would refuse fails the render here, not
the pod at its start (with Recreate, an upgrade would take osas down). */}}
{{- define "osas.configChecks" -}}
{{- $config := .Values.config }}
{{- $reconcile := include "osas.withDefaults" (dict "name" "reconcile" "given" $config.reconcile) | fromJson }}
{{- $interval := include "osas.seconds" $reconcile.interval | float64 }}
{{- if lt (include "osas.seconds" $reconcile.full_resync_interval | float64) $interval }}
{{- fail "config.reconcile: full_resync_interval must not be shorter than interval" }}
{{- end }}
{{- if le (include "osas.seconds" $reconcile.max_inventory_age | float64) $interval }}
{{- fail "config.reconcile: max_inventory_age must be longer than interval" }}
{{- end }}
{{- $election := include "osas.withDefaults" (dict "name" "leader_election" "given" $config.leader_election) | fromJson }}
{{- $retry := include "osas.seconds" $election.retry_period | float64 }}
{{- $renew := include "osas.seconds" $election.renew_deadline | float64 }}
{{- $lease := include "osas.seconds" $election.lease_duration | float64 }}
{{- if not (and (lt $retry $renew) (lt $renew $lease)) }}
{{- fail "config.leader_election: retry_period < renew_deadline < lease_duration must hold: a holder that cannot renew stops writing before the lease can pass to another" }}
{{- end }}
{{- $openstack := include "osas.withDefaults" (dict "name" "openstack" "given" $config.openstack) | fromJson }}
{{- $window := include "osas.seconds" $reconcile.create_doubt_window | float64 }}
{{- $timeout := include "osas.seconds" $openstack.api_timeout | float64 }}
{{- if le $window $timeout }}
{{- fail (printf "config: reconcile.create_doubt_window (%ss) must be longer than openstack.api_timeout (%ss): Nova may still store a create after the client gave up waiting for it" (toString $window) (toString $timeout)) }}
{{- end }}
{{- if and (eq $config.listen $config.health_listen) (not (hasSuffix ":0" $config.listen)) }}
{{- fail "config: listen and health_listen must differ" }}
{{- end }}
{{- with $config.metrics_listen }}
{{- if and (has . (list $config.listen $config.health_listen)) (not (hasSuffix ":0" .)) }}
{{- fail "config: metrics_listen must differ from listen and health_listen" }}
{{- end }}
{{- end }}
{{- $seen := dict }}
{{- range $index, $group := $config.node_groups }}
{{- $where := printf "config.node_groups[%d](%s)" $index $group.id }}
{{- if gt (int $group.min_size) (int $group.max_size) }}
{{- fail (printf "%s: min_size %d is greater than max_size %d" $where (int $group.min_size) (int $group.max_size)) }}
{{- end }}
{{- $inline := and (hasKey $group "user_data") (not (kindIs "invalid" $group.user_data)) }}
{{- $file := and (hasKey $group "user_data_file") (not (kindIs "invalid" $group.user_data_file)) }}
{{- if $inline }}
{{- $encoded := len (b64enc $group.user_data) }}
{{- if gt $encoded 65535 }}
{{- fail (printf "%s: user_data is %d bytes base64-encoded; Nova accepts 65535" $where $encoded) }}
{{- end }}
{{- end }}
{{- if and $inline $file }}
{{- fail (printf "%s: give either user_data or user_data_file, not both" $where) }}
{{- end }}
{{- if and $group.user_data_vars (not $inline) (not $file) }}
{{- fail (printf "%s: user_data_vars needs a template: user_data or user_data_file" $where) }}
{{- end }}
{{- if and $inline (eq (default "text" $group.user_data_format) "json") }}
{{- $parsed := printf "{\"user_data\": %s}" $group.user_data | fromJson }}
{{- if or (hasKey $parsed "Error") (ne (len $parsed) 1) }}
{{- fail (printf "%s: user_data is not JSON (user_data_format: json)" $where) }}
{{- end }}
{{- end }}
{{- if not (kindIs "invalid" $group.bootstrap_token) }}
{{- $token := include "osas.withDefaults" (dict "name" "bootstrap_token" "given" $group.bootstrap_token) | fromJson }}
{{- $ttl := include "osas.seconds" $token.ttl | float64 }}
{{- if or (lt $ttl 120.0) (gt $ttl 86400.0) }}
{{- fail (printf "%s: bootstrap_token.ttl must be between 2m and 24h, not %ss: long enough for a server to build and join, short enough that user data read later joins nothing" $where (toString $ttl)) }}
{{- end }}
{{- if not (or $inline $file) }}
{{- fail (printf "%s: bootstrap_token needs a template to fill ${bootstrap_token} in: user_data or user_data_file" $where) }}
{{- end }}
{{- $warm := not (kindIs "invalid" $group.warm_pool) }}
{{- if and $inline $warm (contains "${bootstrap_token}" $group.user_data) }}
{{- fail (printf "%s: with warm_pool the join token reaches a server at its claim, in its metadata (osas-join-token): the template must not say ${bootstrap_token}" $where) }}
{{- end }}
{{- if and $inline (not $warm) (not (contains "${bootstrap_token}" $group.user_data)) }}
{{- fail (printf "%s: bootstrap_token is set but user_data never says ${bootstrap_token}: every create would mint a token nothing uses" $where) }}
{{- end }}
{{- with (default (dict) $group.options).max_node_provision_time }}
{{- if lt $ttl (include "osas.seconds" . | float64) }}
{{- fail (printf "%s: bootstrap_token.ttl (%ss) is shorter than options.max_node_provision_time: a server that joins late but in time for CA would find its token expired" $where (toString $ttl)) }}
{{- end }}
{{- end }}
{{- end }}
{{- if not (kindIs "invalid" $group.warm_pool) }}
{{- $pool := $group.warm_pool }}
{{- if and (hasKey $pool "size") (not (kindIs "invalid" $pool.size)) (gt (int $pool.size) (int $group.max_size)) }}
{{- fail (printf "%s: warm_pool.size %d is greater than max_size %d: a warm server beyond it could never be claimed" $where (int $pool.size) (int $group.max_size)) }}
{{- end }}
{{- if not (or $inline $file) }}
{{- fail (printf "%s: warm_pool needs user data that prepares a server and stops it (user_data or user_data_file)" $where) }}
{{- end }}
{{- end }}
{{- if hasKey $seen $group.id }}
{{- fail (printf "config: duplicate node group id '%s'" $group.id) }}
{{- end }}
{{- $_ := set $seen $group.id true }}
{{- end }}
{{- end }}

{{/*
Seconds in a Go duration as cert-manager takes them ("2160h", "1h30m", "90s"): the alert on
CA's client certificate compares with clientRenewBefore.
*/}}
{{- define "osas.durationSeconds" -}}
{{- $total := 0.0 -}}
{{- range regexFindAll "[0-9]+(\\.[0-9]+)?(ms|h|m|s)" . -1 -}}
{{- $number := regexFind "^[0-9]+(\\.[0-9]+)?" . | float64 -}}
{{- $unit := regexReplaceAll "^[0-9]+(\\.[0-9]+)?" . "" -}}
{{- $total = addf $total (mulf $number (get (dict "h" 3600.0 "m" 60.0 "s" 1.0 "ms" 0.001) $unit)) -}}
{{- end -}}
{{- printf "%.0f" $total -}}
{{- end -}}

{{/*
How long before its end CA's client certificate is renewed, in seconds: cert-manager's
clientRenewBefore; 30 days for a certificate the chart does not make (its schedule is not
known here).
*/}}
{{- define "osas.clientRenewBeforeSeconds" -}}
{{- if .Values.tls.certManager.enabled -}}
{{- include "osas.durationSeconds" .Values.tls.certManager.clientRenewBefore -}}
{{- else -}}
2592000
{{- end -}}
{{- end -}}
