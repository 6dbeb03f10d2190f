{{/*
Cross-field rules values.schema.json cannot express, and what KubeRay, Kueue or KAI would refuse later.
Each failure is one line naming the values and the fix.
Invariant: a release that renders is one the operator accepts and that can run: no two pods fighting over a
ReadWriteOnce claim, every GPU asked for by sc-app's actors is offered by a worker group, and every pod's grace
period leaves room for the preStop hook to stop the run with a bundle.
*/}}
{{- define "sc-app.validate" -}}
{{- $v := .Values -}}
{{- if and (not $v.image.tag) (not $v.image.digest) -}}
{{- fail "image.tag is required (or image.digest): a retried job must run the same image as the attempt it resumes; pass --set image.tag=<version>" -}}
{{- end -}}
{{- if and (eq (lower $v.image.tag) "latest") (not $v.image.digest) -}}
{{- fail "image.tag \"latest\" is refused: a retry could run different code than the attempt it resumes; use a version tag or set image.digest" -}}
{{- end -}}
{{- $name := include "sc-app.fullname" . -}}
{{- if not (regexMatch "^[a-z]([-a-z0-9]*[a-z0-9])?$" $name) -}}
{{- fail (printf "release name %q gives the RayJob/RayCluster name %q, which KubeRay refuses (not a DNS-1035 label: lowercase letters, digits and '-', starting with a letter); choose a release name that starts with a letter, or set fullnameOverride" .Release.Name $name) -}}
{{- end -}}
{{- include "sc-app.validateJob" . -}}
{{- include "sc-app.validateSafety" . -}}
{{- include "sc-app.validateShm" . -}}
{{- include "sc-app.validateEphemeral" . -}}
{{- include "sc-app.validateSchedulers" . -}}
{{- include "sc-app.validateVolumes" . -}}
{{- include "sc-app.validateGroups" . -}}
{{- include "sc-app.validateStop" . -}}
{{- include "sc-app.validateConfig" . -}}
{{- include "sc-app.validateExtraContainers" . -}}
{{- include "sc-app.validateExtendedResources" . -}}
{{- include "sc-app.validateHmac" . -}}
{{- include "sc-app.validatePlacement" . -}}
{{- end -}}

{{/* RayJob fields KubeRay's ValidateRayJobSpec refuses (checked only with mode RayJob). */}}
{{- define "sc-app.validateJob" -}}
{{- $j := .Values.job -}}
{{- if eq .Values.mode "RayJob" -}}
{{- if and (eq $j.submissionMode "InteractiveMode") (gt (int $j.backoffLimit) 0) -}}
{{- fail (printf "job.submissionMode=InteractiveMode with job.backoffLimit=%d: KubeRay allows no retries in InteractiveMode; set job.backoffLimit=0 or use another submissionMode" (int $j.backoffLimit)) -}}
{{- end -}}
{{- if and $j.suspend (not $j.shutdownAfterJobFinishes) -}}
{{- fail "job.suspend=true with job.shutdownAfterJobFinishes=false: KubeRay refuses to suspend a RayJob that keeps its cluster; set job.shutdownAfterJobFinishes=true" -}}
{{- end -}}
{{- if and $j.deletionRules $j.shutdownAfterJobFinishes -}}
{{- fail "job.deletionRules with job.shutdownAfterJobFinishes=true: KubeRay refuses both; set job.shutdownAfterJobFinishes=false (the rules decide what is deleted)" -}}
{{- end -}}
{{- $seen := dict -}}
{{- range $i, $r := $j.deletionRules -}}
{{- if eq (len (pick $r.condition "jobStatus" "jobDeploymentStatus")) 1 | not -}}
{{- fail (printf "job.deletionRules[%d].condition needs exactly one of jobStatus, jobDeploymentStatus (KubeRay refuses it otherwise)" $i) -}}
{{- end -}}
{{- $on := ternary (printf "jobStatus %v" $r.condition.jobStatus) (printf "jobDeploymentStatus %v" $r.condition.jobDeploymentStatus) (hasKey $r.condition "jobStatus") -}}
{{- $key := printf "%s|%s" $on $r.policy -}}
{{- if hasKey $seen $key -}}
{{- fail (printf "job.deletionRules[%d] repeats job.deletionRules[%d] (%s on %s): KubeRay refuses duplicate rules; keep one" $i (get $seen $key) $r.policy $on) -}}
{{- end -}}
{{- $_ := set $seen $key $i -}}
{{- end -}}
{{- include "sc-app.validateDeletionOrder" $j.deletionRules -}}
{{- end -}}
{{- end -}}

{{/* What the queueing and gang schedulers named by `labels` refuse (Kueue's and KAI's admission rules). */}}
{{- define "sc-app.validateSchedulers" -}}
{{- $v := .Values -}}
{{- $k8sJob := and (eq $v.mode "RayJob") (eq $v.job.submissionMode "K8sJobMode") -}}
{{- $labels := default (dict) $v.labels -}}
{{- if hasKey $labels "kueue.x-k8s.io/queue-name" -}}
{{- if and (eq $v.mode "RayJob") (not $v.job.shutdownAfterJobFinishes) -}}
{{- fail "labels kueue.x-k8s.io/queue-name with job.shutdownAfterJobFinishes=false: Kueue refuses a RayJob that keeps its cluster; set job.shutdownAfterJobFinishes=true" -}}
{{- end -}}
{{- $max := ternary 6 7 $k8sJob -}}
{{- if gt (len $v.workerGroups) $max -}}
{{- fail (printf "labels kueue.x-k8s.io/queue-name with %d workerGroups: a Kueue workload holds at most 8 pod sets (head%s + %d worker groups)" (len $v.workerGroups) (ternary ", submitter" "" $k8sJob) $max) -}}
{{- end -}}
{{- $reserved := ternary (list "head" "submitter") (list "head") $k8sJob -}}
{{- range $v.workerGroups -}}
{{- if has .name $reserved -}}
{{- fail (printf "workerGroups name %q is reserved by Kueue for the %s pod set; rename the group" .name .name) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if and (hasKey $labels "kai.scheduler/queue") $k8sJob -}}
{{- fail "labels kai.scheduler/queue with job.submissionMode=K8sJobMode: KAI Scheduler cannot gang-schedule the submitter Job; use job.submissionMode=HTTPMode or SidecarMode" -}}
{{- end -}}
{{- end -}}

{{/* The checkpoint claim (RWX when several pods mount it) or each pod's own directory with a bucket, and the
read-only model claim. */}}
{{- define "sc-app.validateVolumes" -}}
{{- $v := .Values -}}
{{- $p := $v.checkpoint.persistence -}}
{{- $remote := dig "checkpoint" "remote" "url" "" ($v.config | default dict) -}}
{{- $pods := include "sc-app.mountingPods" . | int -}}
{{- if eq $v.checkpoint.volume "local" -}}
{{- if not $remote -}}
{{- fail (printf "checkpoint.volume=local without config.checkpoint.remote.url: each of the %d pods would keep its bundles on its own disk, lost with the pod; set config.checkpoint.remote.url (s3://bucket/prefix, docs/object-storage.md) or use checkpoint.volume=shared with a volume" $pods) -}}
{{- end -}}
{{- end -}}
{{- if and $v.checkpoint.awsWebIdentity.roleArn (hasKey (default dict $v.serviceAccount.annotations) "eks.amazonaws.com/role-arn") -}}
{{- fail "checkpoint.awsWebIdentity.roleArn and serviceAccount.annotations eks.amazonaws.com/role-arn both give the pods an AWS role: on EKS keep the annotation (IRSA), elsewhere the roleArn" -}}
{{- end -}}
{{- if ne $v.checkpoint.volume "local" -}}
{{- if and (not $p.create) (not $p.existingClaim) -}}
{{- fail "checkpoint.persistence.existingClaim is required when checkpoint.persistence.create=false" -}}
{{- end -}}
{{- if and $p.create $p.existingClaim -}}
{{- fail "checkpoint.persistence: set either create=true or existingClaim, not both" -}}
{{- end -}}
{{- $modes := $p.accessModes -}}
{{- if $p.existingClaim -}}
{{- $live := lookup "v1" "PersistentVolumeClaim" .Release.Namespace $p.existingClaim -}}
{{- if $live -}}{{- $modes = $live.spec.accessModes -}}{{- end -}}
{{- end -}}
{{- if and (gt $pods 1) (not (has "ReadWriteMany" $modes)) -}}
{{- fail (printf "checkpoint.persistence.accessModes %v: %d pods (head + workers) mount the checkpoint volume, which needs ReadWriteMany; use an RWX storage class, or a bucket instead (checkpoint.volume=local with config.checkpoint.remote.url, helm/sc-app/ci/no-rwx-values.yaml), or set workerGroups to []" $modes $pods) -}}
{{- end -}}
{{- if and $p.create (has "ReadWriteMany" $p.accessModes) (not $p.storageClassName) -}}
{{- fail (printf "checkpoint.persistence.storageClassName is empty with accessModes [ReadWriteMany]: the cluster's default class is ReadWriteOnce-only on EKS, GKE and AKS, so the claim would stay Pending and every attempt with it; name an RWX class (%s), or use a bucket instead (checkpoint.volume=local, helm/sc-app/ci/no-rwx-values.yaml), or run on one pod with helm/sc-app/ci/single-pod-rwo-values.yaml" (include "sc-app.rwxClassHint" .)) -}}
{{- end -}}
{{- end -}}
{{- $m := $v.model -}}
{{- if eq $m.source "claim" -}}
{{- if not $m.existingClaim -}}
{{- fail "model.source=claim needs model.existingClaim (the PVC holding the model directory)" -}}
{{- end -}}
{{- if not $m.path -}}
{{- fail "model.source=claim needs model.path (the model directory relative to the claim's root)" -}}
{{- end -}}
{{- if eq (clean $m.mountPath) (clean $v.checkpoint.mountPath) -}}
{{- fail (printf "model.mountPath %s is checkpoint.mountPath too; mount the model elsewhere (e.g. /models)" $m.mountPath) -}}
{{- end -}}
{{- $live := lookup "v1" "PersistentVolumeClaim" .Release.Namespace $m.existingClaim -}}
{{- if and $live (gt $pods 1) (not (or (has "ReadOnlyMany" $live.spec.accessModes) (has "ReadWriteMany" $live.spec.accessModes))) -}}
{{- fail (printf "model.existingClaim %s is %v: %d pods mount the model, which needs ReadOnlyMany or ReadWriteMany" $m.existingClaim $live.spec.accessModes $pods) -}}
{{- end -}}
{{- else if eq $m.source "image" -}}
{{- if not (isAbs $m.path) -}}
{{- fail (printf "model.source=image needs model.path, the absolute directory of the model inside the image (got %q)" $m.path) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Worker groups: unique names, GPU groups that ask for GPUs, and enough GPUs for sc-app's actors. */}}
{{- define "sc-app.validateGroups" -}}
{{- $v := .Values -}}
{{- $names := dict -}}
{{- $offered := 0.0 -}}
{{- $perPod := 0.0 -}}
{{- range $i, $g := $v.workerGroups -}}
{{- if hasKey $names $g.name -}}
{{- fail (printf "workerGroups[%d].name %q is used twice; group names must be unique" $i $g.name) -}}
{{- end -}}
{{- $_ := set $names $g.name true -}}
{{- $limits := dict -}}
{{- if $g.resources -}}{{- $limits = default (dict) $g.resources.limits -}}{{- end -}}
{{- $gpus := index $limits $g.gpuResource | default 0 | int -}}
{{- if and (eq $g.accelerator "gpu") (lt $gpus 1) -}}
{{- fail (printf "workerGroups[%d] (%s) is accelerator=gpu but requests no %s: set resources.limits.%s (Ray would advertise GPUs the pod does not have)" $i $g.name $g.gpuResource $g.gpuResource) -}}
{{- end -}}
{{- if and (eq $g.accelerator "cpu") (gt $gpus 0) -}}
{{- fail (printf "workerGroups[%d] (%s) is accelerator=cpu but requests %d %s; set accelerator=gpu" $i $g.name $gpus $g.gpuResource) -}}
{{- end -}}
{{- $pod := include "sc-app.podGpus" $g | float64 -}}
{{- $offered = addf $offered (mulf $pod (int $g.replicas)) -}}
{{- if and (gt (int $g.replicas) 0) (gt $pod $perPod) -}}{{- $perPod = $pod -}}{{- end -}}
{{- end -}}
{{- $headGpus := include "sc-app.podGpus" $v.head | float64 -}}
{{- $offered = addf $offered $headGpus -}}
{{- if gt $headGpus $perPod -}}{{- $perPod = $headGpus -}}{{- end -}}
{{- $cfg := default (dict) $v.config -}}
{{- $asked := 0.0 -}}
{{- range $role := list "trainer" "generation" -}}
{{- $a := default (dict) (get $cfg $role) -}}
{{- $n := add (default 1 $a.num_workers | int) (default 0 $a.spare_ranks | int) -}}
{{- $each := default 0 $a.num_gpus | float64 -}}
{{- $asked = addf $asked (mulf $n $each) -}}
{{- if gt $each $perPod -}}
{{- fail (printf "config.%s.num_gpus=%v but no pod offers more than %v GPUs: one actor must fit on one pod; lower it or give a worker group more GPUs per pod" $role $each $perPod) -}}
{{- end -}}
{{- end -}}
{{- if gt $asked $offered -}}
{{- fail (printf "config asks %v GPUs ((trainer num_workers + spare_ranks) x num_gpus + generation num_workers x num_gpus) but the worker groups provide %v (replicas x GPUs per pod): the actors would wait forever; add replicas/GPUs or lower config" $asked $offered) -}}
{{- end -}}
{{- end -}}

{{/* The stop chain: emergency_budget_s < preStop.waitSeconds, and waitSeconds + rayShutdownSeconds <= every grace period. */}}
{{- define "sc-app.validateStop" -}}
{{- $v := .Values -}}
{{- $cfg := default (dict) $v.config -}}
{{- $budget := default 60 (default (dict) $cfg.checkpoint).emergency_budget_s | float64 -}}
{{- $wait := $v.preStop.waitSeconds | int -}}
{{- $need := add $wait $v.preStop.rayShutdownSeconds -}}
{{- if ge $budget (float64 $wait) -}}
{{- fail (printf "config.checkpoint.emergency_budget_s (%v) must be below preStop.waitSeconds (%d): the stop hook has to outlast the emergency bundle it waits for" $budget $wait) -}}
{{- end -}}
{{- $groups := list (dict "name" "head" "grace" $v.head.terminationGracePeriodSeconds) -}}
{{- range $i, $g := $v.workerGroups -}}
{{- $groups = append $groups (dict "name" (printf "workerGroups[%d] (%s)" $i $g.name) "grace" $g.terminationGracePeriodSeconds) -}}
{{- end -}}
{{- range $groups -}}
{{- if lt (int .grace) $need -}}
{{- fail (printf "%s.terminationGracePeriodSeconds (%d) must be at least preStop.waitSeconds (%d) + preStop.rayShutdownSeconds (%d): the kubelet kills the pod when the grace period ends" .name (int .grace) $wait (int $v.preStop.rayShutdownSeconds)) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Keys of config the chart owns, and a model for the hf backend. */}}
{{- define "sc-app.validateConfig" -}}
{{- $v := .Values -}}
{{- $cfg := default (dict) $v.config -}}
{{- if and (hasKey $cfg "checkpoint") (hasKey (default (dict) $cfg.checkpoint) "dir") -}}
{{- fail "config.checkpoint.dir is set by the chart from checkpoint.mountPath; remove it from config" -}}
{{- end -}}
{{- if and (hasKey $cfg "ray") (hasKey (default (dict) $cfg.ray) "address") -}}
{{- fail "config.ray.address is set by the chart (auto: join the KubeRay cluster); remove it from config" -}}
{{- end -}}
{{- $model := default (dict) $cfg.model -}}
{{- if and $v.model.source (hasKey $model "path") -}}
{{- fail (printf "config.model.path is set by the chart from model.source=%s (model.path); remove it from config" $v.model.source) -}}
{{- end -}}
{{- if and (eq (toString $model.backend) "hf") (not $v.model.source) (not $model.path) -}}
{{- fail "config.model.backend=hf needs a model: set model.source=claim (with model.existingClaim, model.path) or model.source=image (with model.path)" -}}
{{- end -}}
{{- end -}}

{{/* The RWX storage classes of the managed clouds, for refusal messages (docs/kubernetes-storage.md has the details). */}}
{{- define "sc-app.rwxClassHint" -}}
EKS: an EFS class of efs.csi.aws.com, e.g. efs-sc; GKE: Filestore standard-rwx; AKS: Azure Files azurefile-csi
{{- end -}}

{{/* KubeRay's TTL order per condition: DeleteWorkers <= DeleteCluster <= DeleteSelf (validateTTLConsistency). */}}
{{- define "sc-app.validateDeletionOrder" -}}
{{- $rules := . -}}
{{- range $r := $rules -}}
{{- $on := ternary (printf "jobStatus %v" $r.condition.jobStatus) (printf "jobDeploymentStatus %v" $r.condition.jobDeploymentStatus) (hasKey $r.condition "jobStatus") -}}
{{- $prev := dict -}}
{{- range $policy := list "DeleteWorkers" "DeleteCluster" "DeleteSelf" -}}
{{- range $o := $rules -}}
{{- $oOn := ternary (printf "jobStatus %v" $o.condition.jobStatus) (printf "jobDeploymentStatus %v" $o.condition.jobDeploymentStatus) (hasKey $o.condition "jobStatus") -}}
{{- if and (eq $oOn $on) (eq $o.policy $policy) -}}
{{- $ttl := default 0 $o.condition.ttlSeconds | int -}}
{{- if and $prev (lt $ttl (int $prev.ttl)) -}}
{{- fail (printf "job.deletionRules on %s: %s ttlSeconds (%d) is below %s ttlSeconds (%d); KubeRay requires DeleteWorkers <= DeleteCluster <= DeleteSelf" $on $policy $ttl $prev.policy (int $prev.ttl)) -}}
{{- end -}}
{{- $prev = dict "policy" $policy "ttl" $ttl -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Combinations that render valid objects but are unsafe or rejected by the cluster at pod admission. */}}
{{- define "sc-app.validateSafety" -}}
{{- $v := .Values -}}
{{- if and (not $v.rayAuth.enabled) (not $v.networkPolicy.enabled) (not $v.rayAuth.acceptOpenCluster) -}}
{{- fail "rayAuth.enabled=false with networkPolicy.enabled=false: any pod in the cluster could submit code that runs with the checkpoint volume and the HMAC key; enable one of them, or set rayAuth.acceptOpenCluster=true if something else (a service mesh) guards the head" -}}
{{- end -}}
{{- if and $v.rayAuth.enabled $v.rayAuth.gitops (not $v.rayAuth.existingSecret) -}}
{{- fail "rayAuth.gitops=true without rayAuth.existingSecret: rendered without cluster access the chart would make a new Ray token at every render while the running pods keep the old one (KubeRay's status checks get 401 and fail the job for good after 300 s, JobStatusCheckTimeoutExceeded); create the Secret once (key auth_token) and name it in rayAuth.existingSecret" -}}
{{- end -}}
{{- if and (eq $v.mode "RayJob") (eq $v.job.submissionMode "SidecarMode") (eq $v.podSecurityStandard "restricted") -}}
{{- fail "job.submissionMode=SidecarMode with podSecurityStandard=restricted: KubeRay adds its submitter container to the head pod without a securityContext, so a namespace enforcing the restricted Pod Security Standard rejects the head pod; use K8sJobMode or HTTPMode, or set podSecurityStandard=baseline if the namespace does not enforce restricted" -}}
{{- end -}}
{{- if and $v.metrics.podMonitor.enabled $v.networkPolicy.enabled (not $v.networkPolicy.monitoringNamespace) -}}
{{- fail "metrics.podMonitor.enabled without networkPolicy.monitoringNamespace: the NetworkPolicy would drop every scrape; set networkPolicy.monitoringNamespace to Prometheus' namespace" -}}
{{- end -}}
{{- end -}}

{{/* /dev/shm is memory charged to the container: a shmSize above the memory limit gets the pod OOM-killed. */}}
{{- define "sc-app.validateShm" -}}
{{- $groups := list (dict "name" "head" "g" .Values.head) -}}
{{- range $i, $g := .Values.workerGroups -}}
{{- $groups = append $groups (dict "name" (printf "workerGroups[%d] (%s)" $i $g.name) "g" $g) -}}
{{- end -}}
{{- range $groups -}}
{{- $limit := dig "resources" "limits" "memory" "" .g -}}
{{- if and .g.shmSize $limit -}}
{{- if gt (include "sc-app.bytes" .g.shmSize | float64) (include "sc-app.bytes" $limit | float64) -}}
{{- fail (printf "%s.shmSize %v is above its memory limit %v: /dev/shm is memory charged to the container, so Ray's object store filling it gets the pod OOM-killed; lower shmSize or raise resources.limits.memory" .name .g.shmSize $limit) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* scratch.ephemeralStorage: a request above the limit is refused by the API server (every Ray pod). */}}
{{- define "sc-app.validateEphemeral" -}}
{{- $e := .Values.scratch.ephemeralStorage -}}
{{- if and $e.request $e.limit -}}
{{- if gt (include "sc-app.bytes" $e.request | float64) (include "sc-app.bytes" $e.limit | float64) -}}
{{- fail (printf "scratch.ephemeralStorage.request %v is above its limit %v: the API server refuses every Ray pod; lower the request or raise the limit" $e.request $e.limit) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* A Kubernetes quantity ("16Gi", "500M", "1024") in bytes, as a float. */}}
{{- define "sc-app.bytes" -}}
{{- $q := toString . -}}
{{- $units := dict "Ki" 1024.0 "Mi" 1048576.0 "Gi" 1073741824.0 "Ti" 1099511627776.0 "k" 1000.0 "M" 1000000.0 "G" 1000000000.0 "T" 1000000000000.0 -}}
{{- $n := 0.0 -}}
{{- $done := false -}}
{{- range $suffix := list "Ki" "Mi" "Gi" "Ti" "k" "M" "G" "T" -}}
{{- if and (not $done) (hasSuffix $suffix $q) -}}
{{- $n = mulf (trimSuffix $suffix $q | float64) (get $units $suffix) -}}
{{- $done = true -}}
{{- end -}}
{{- end -}}
{{- if not $done -}}{{- $n = float64 $q -}}{{- end -}}
{{- $n -}}
{{- end -}}

{{/*
extraContainers of the head and every worker group: what the API server or Pod Security admission would refuse
(a container name twice in a pod, a mount of a volume the pod does not have, privilege under "restricted").
*/}}
{{- define "sc-app.validateExtraContainers" -}}
{{- $v := .Values -}}
{{- $groups := list (dict "where" "head" "g" $v.head "names" (list "ray-head" "preflight")) -}}
{{- range $i, $g := $v.workerGroups -}}
{{- $groups = append $groups (dict "where" (printf "workerGroups[%d] (%s)" $i $g.name) "g" $g "names" (list "ray-worker")) -}}
{{- end -}}
{{- range $groups -}}
{{- $where := .where -}}
{{- $names := .names -}}
{{- $volumes := list "checkpoints" "config" "model" "ray-tmp" "dshm" "tmp" "home" -}}
{{- range concat (default (list) $v.extraVolumes) (default (list) .g.extraVolumes) -}}{{- $volumes = append $volumes .name -}}{{- end -}}
{{- range concat (default (list) $v.extraContainers) (default (list) .g.extraContainers) -}}
{{- if has .name $names -}}
{{- fail (printf "extraContainers name %q appears twice in the %s pod (or names a container the chart makes: %s); Kubernetes refuses duplicate container names" .name $where (join ", " $names)) -}}
{{- end -}}
{{- $names = append $names .name -}}
{{- $cname := .name -}}
{{- range .volumeMounts -}}
{{- if not (has .name $volumes) -}}
{{- fail (printf "extraContainers %q mounts volume %q, which the %s pod does not have; add it to extraVolumes (Ray's logs: volume ray-tmp)" $cname .name $where) -}}
{{- end -}}
{{- end -}}
{{- $sc := default (dict) .securityContext -}}
{{- if and (eq $v.podSecurityStandard "restricted") (or $sc.privileged $sc.allowPrivilegeEscalation (eq (toString (default "" $sc.runAsUser)) "0")) -}}
{{- fail (printf "extraContainers %q in the %s pod asks for privileges (privileged, allowPrivilegeEscalation or runAsUser 0) that podSecurityStandard=restricted refuses; drop them" .name $where) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
Resources the kubelet cannot overcommit (extended resources such as nvidia.com/gpu or vpc.amazonaws.com/efa, and
hugepages-*): the API server refuses a pod whose request differs from its limit or that requests one without a limit.
*/}}
{{- define "sc-app.validateExtendedResources" -}}
{{- $groups := list (dict "where" "head" "g" .Values.head) -}}
{{- range $i, $g := .Values.workerGroups -}}
{{- $groups = append $groups (dict "where" (printf "workerGroups[%d] (%s)" $i $g.name) "g" $g) -}}
{{- end -}}
{{- range $groups -}}
{{- $res := default (dict) .g.resources -}}
{{- $req := default (dict) $res.requests -}}
{{- $lim := default (dict) $res.limits -}}
{{- $where := .where -}}
{{- range $name := keys $req | sortAlpha -}}
{{- if or (contains "/" $name) (hasPrefix "hugepages-" $name) -}}
{{- if not (hasKey $lim $name) -}}
{{- fail (printf "%s resources.requests.%s has no limit: Kubernetes cannot overcommit %s and refuses the pod; set resources.limits.%s to the same value" $where $name $name $name) -}}
{{- end -}}
{{- $a := include "sc-app.bytes" (index $req $name) -}}
{{- $b := include "sc-app.bytes" (index $lim $name) -}}
{{- if ne $a $b -}}
{{- fail (printf "%s resources.requests.%s=%v differs from its limit %v: Kubernetes refuses a pod whose request and limit of %s differ; make them equal" $where $name (index $req $name) (index $lim $name) $name) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if and (gt (len (pick $lim "hugepages-2Mi" "hugepages-1Gi")) 0) (not (or $lim.memory $req.memory $lim.cpu $req.cpu)) -}}
{{- fail (printf "%s resources ask for hugepages without a cpu or memory request: Kubernetes refuses such a pod; add memory" $where) -}}
{{- end -}}
{{- end -}}
{{- end -}}
