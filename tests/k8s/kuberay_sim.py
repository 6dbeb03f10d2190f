"""What the KubeRay operator does to a rendered RayJob before the kubelet runs it: pod labels, the Ray container's
command line and environment, the K8sJobMode submitter's command, the service names.

Ported from KubeRay @feeaf72 (``ray-operator/controllers/ray/common/pod.go``: ``BuildPod``, ``labelPod``,
``setMissingRayStartParams``, ``generateRayStartCommand``, ``convertParamMap``, ``setContainerEnvVars``,
``SetContainerTokenAuthEnvVars``; ``common/job.go``: ``BuildJobSubmitCommand``; ``rayjob_controller.go``:
``configureSubmitterContainer``; ``utils/util.go``: ``GetContainerCommand``, ``GenerateFQDNServiceName``).
Left out: autoscaler, GCS fault tolerance, TLS, probes, Kubernetes-token auth, TPU/Neuron accelerator resources.
"""

from __future__ import annotations

import base64
import json
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.k8s.podsim import Container, Exited, Network, Pod, Termination, Volumes, container_mounts, quantity

CLUSTER_DOMAIN = "cluster.local"
DEFAULT_GCS_PORT = "6379"
DEFAULT_DASHBOARD_PORT = 8265
DEFAULT_METRICS_PORT = "8080"
DEFAULT_DASHBOARD_AGENT_LISTEN_PORT = "52365"
BOOLEAN_VALUED = ("log-color", "include-dashboard", "include-log-monitor")  # convertParamMap keeps "=false" for these

def container_command(login_shell: bool = False, extra: str = "") -> list[str]:
    """``GetContainerCommand``: ``-lc`` only when the operator runs with ENABLE_LOGIN_SHELL=true."""
    return ["/bin/bash", f"-c{extra}{'l' if login_shell else ''}", "--"]


def read_only_root(container: Mapping[str, Any]) -> bool:
    return bool((container.get("securityContext") or {}).get("readOnlyRootFilesystem"))


def cluster_name(rayjob_name: str, suffix: str = "sim01") -> str:
    """The RayCluster a RayJob attempt gets: ``<rayjob>-<5 random chars>``."""
    return f"{rayjob_name}-{suffix}"


def head_service_fqdn(cluster: str, namespace: str) -> str:
    """``GenerateFQDNServiceName``: what workers put in ``--address``."""
    return f"{cluster}-head-svc.{namespace}.svc.{CLUSTER_DOMAIN}"


def rayjob_dashboard_url(rayjob_name: str, namespace: str, port: int = DEFAULT_DASHBOARD_PORT) -> str:
    """``RayJob.status.dashboardURL``: the RayJob's own head service, which the submitter talks to."""
    return f"{rayjob_name}-head-svc.{namespace}.svc.{CLUSTER_DOMAIN}:{port}"


def pod_labels(template_labels: Mapping[str, str], node_type: str, cluster: str, group: str) -> dict[str, str]:
    """``labelPod``: KubeRay's labels, then the template's (which win, except cluster/node-type/group)."""
    labels = {
        "ray.io/is-ray-node": "yes",
        "ray.io/cluster": cluster,
        "ray.io/node-type": node_type,
        "ray.io/group": group,
        "ray.io/identifier": f"{cluster}-{node_type}",
        "app.kubernetes.io/name": "kuberay",
        "app.kubernetes.io/created-by": "kuberay-operator",
    }
    for key, value in template_labels.items():
        if key not in ("ray.io/node-type", "ray.io/group", "ray.io/cluster"):
            labels[key] = value
    return labels


def submitter_labels(template_labels: Mapping[str, str], rayjob_name: str) -> dict[str, str]:
    return {**template_labels, "ray.io/originated-from-cr-name": rayjob_name,
            "ray.io/originated-from-crd": "RayJob", "app.kubernetes.io/created-by": "kuberay-operator"}


def complete_params(
    params: Mapping[str, str], node_type: str, head_port: str, fqdn: str, limits: Mapping[str, Any],
    requests: Mapping[str, Any],
) -> dict[str, str]:
    """``setMissingRayStartParams`` + the resource part of ``generateRayStartCommand``."""
    out = {k: str(v) for k, v in params.items()}
    if node_type == "worker":
        out.setdefault("address", f"{fqdn}:{head_port}")
    if node_type == "head":
        out.setdefault("dashboard-host", "0.0.0.0")
    out.setdefault("metrics-export-port", DEFAULT_METRICS_PORT)
    out["block"] = "true"
    out.setdefault("dashboard-agent-listen-port", DEFAULT_DASHBOARD_AGENT_LISTEN_PORT)
    if "num-cpus" not in out:
        cpu = limits.get("cpu") or requests.get("cpu")
        if cpu and quantity(cpu) > 0:
            out["num-cpus"] = str(math.ceil(quantity(cpu)))
    if "memory" not in out and limits.get("memory"):
        out["memory"] = str(math.ceil(quantity(limits["memory"])))
    if limits:  # addWellKnownAcceleratorResources gives up when rayStartParams.resources is not plain JSON
        try:
            json.loads(out.get("resources", "{}").strip("'\"` "))
            parsed = True
        except json.JSONDecodeError:
            parsed = False
        if parsed and "num-gpus" not in out:
            for key in sorted(limits):
                if key.endswith("gpu") and quantity(limits[key]) > 0:
                    out["num-gpus"] = str(math.ceil(quantity(limits[key])))
                    break
    return out


def convert_param_map(params: Mapping[str, str]) -> str:
    """``convertParamMap``: sorted ``--key=value``; "true" → bare ``--key``, "false" dropped (not BOOLEAN_VALUED)."""
    flags = ""
    for key in sorted(params):
        value = params[key]
        if value.lower() in ("true", "false") and key not in BOOLEAN_VALUED:
            if value.lower() == "true":
                flags += f" --{key} "
        else:
            flags += f" --{key}={value} "
    return flags


@dataclass(frozen=True)
class RayContainer:
    """The Ray container of one pod as the kubelet receives it from KubeRay."""

    argv: list[str]
    env: dict[str, str]
    ray_start: str = ""  # the generated `ray start ...` (KUBERAY_GEN_RAY_START_CMD); "" for the submitter


def _env_value(item: Mapping[str, Any], secrets: Mapping[str, Mapping[str, str]], fields: Mapping[str, str]) -> str:
    if "value" in item:
        return str(item["value"])
    source = item["valueFrom"]
    if "secretKeyRef" in source:
        ref = source["secretKeyRef"]
        return base64.b64decode(secrets[ref["name"]][ref["key"]]).decode()
    if "fieldRef" in source:
        return fields[source["fieldRef"]["fieldPath"]]
    raise ValueError(f"env {item['name']}: unsupported valueFrom {source}")


def template_env(
    container: Mapping[str, Any], secrets: Mapping[str, Mapping[str, str]], fields: Mapping[str, str]
) -> dict[str, str]:
    """The container's own ``env`` (values, Secret keys, downward-API fields)."""
    return {e["name"]: _env_value(e, secrets, fields) for e in container.get("env", [])}


def ray_container(
    group_spec: Mapping[str, Any], node_type: str, *, cluster: str, namespace: str, pod_name: str, group: str,
    head_port: str, secrets: Mapping[str, Mapping[str, str]], auth_secret: str | None, login_shell: bool = False,
) -> RayContainer:
    """``BuildPod`` for the Ray container (index 0) of a head or worker group spec."""
    template = group_spec["template"]
    container = template["spec"]["containers"][0]
    resources = container.get("resources", {})
    fqdn = head_service_fqdn(cluster, namespace)
    params = complete_params(group_spec.get("rayStartParams", {}), node_type, head_port, fqdn,
                             resources.get("limits", {}), resources.get("requests", {}))
    ray_start = f"ray start{' --head' if node_type == 'head' else ''} {convert_param_map(params)}"
    generated = f"ulimit -n ${{RAY_START_ULIMIT_OPEN_FILES:-65536}}; {ray_start}"
    user_cmd = " ".join(container.get("command", []) + container.get("args", []))
    if "ray start" in user_cmd:
        raise ValueError("the template runs `ray start` itself; KubeRay would keep it as is")
    args = f"{user_cmd} && {generated}" if user_cmd else generated
    labels = pod_labels(template["metadata"].get("labels", {}), node_type, cluster, group)
    fields = {"metadata.name": pod_name, "metadata.namespace": namespace,
              **{f"metadata.labels['{k}']": v for k, v in labels.items()}}
    env = template_env(container, secrets, fields)
    if auth_secret:  # SetContainerTokenAuthEnvVars (token mode, secret-based)
        env.setdefault("RAY_AUTH_MODE", "token")
        env.setdefault("RAY_AUTH_TOKEN", base64.b64decode(secrets[auth_secret]["auth_token"]).decode())
    if node_type == "worker":
        env["FQ_RAY_IP"] = fqdn
        env["RAY_IP"] = fqdn.split(".")[0]
    env["RAY_CLUSTER_NAME"] = cluster
    env["RAY_CLUSTER_NAMESPACE"] = namespace
    env["RAY_CLOUD_INSTANCE_ID"] = pod_name
    env["RAY_NODE_TYPE_NAME"] = group
    env["KUBERAY_GEN_RAY_START_CMD"] = ray_start
    env.setdefault("RAY_PORT", head_port)
    env.setdefault("RAY_ADDRESS", f"{'127.0.0.1' if node_type == 'head' else fqdn}:{head_port}")
    env.setdefault("RAY_USAGE_STATS_KUBERAY_IN_USE", "1")
    if node_type == "head":
        env["RAY_USAGE_STATS_EXTRA_TAGS"] = "kuberay_version=sim;kuberay_crd=RayJob"
    env.setdefault("RAY_DASHBOARD_ENABLE_K8S_DISK_USAGE", "1")
    return RayContainer([*container_command(login_shell), args], env, ray_start)


def wait_gcs_ready_script(fqdn: str, port: str) -> str:
    """The ``wait-gcs-ready`` init container KubeRay injects into every worker pod (``DefaultWorkerPodTemplate``)."""
    return f"""
					SECONDS=0
					while true; do
						if (( SECONDS <= 120 )); then
							if ray health-check --address {fqdn}:{port} > /dev/null 2>&1; then
								echo "GCS is ready."
								break
							fi
							echo "$SECONDS seconds elapsed: Waiting for GCS to be ready."
						else
							if ray health-check --address {fqdn}:{port}; then
								echo "GCS is ready. Any error messages above can be safely ignored."
								break
							fi
							echo "$SECONDS seconds elapsed: Still waiting for GCS to be ready."
						fi
						sleep 5
					done
				"""


def head_port(cluster_spec: Mapping[str, Any]) -> str:
    """``GetHeadPort``: the GCS port workers and drivers connect to."""
    return str(cluster_spec["headGroupSpec"].get("rayStartParams", {}).get("port", DEFAULT_GCS_PORT))


def submitter_container(
    rayjob: Mapping[str, Any], *, job_id: str, dashboard_url: str, secrets: Mapping[str, Mapping[str, str]],
    auth_secret: str | None,
) -> RayContainer:
    """``BuildJobSubmitCommand`` (K8sJobMode) inside ``configureSubmitterContainer``'s ``/bin/bash -ce --``."""
    address = dashboard_url if dashboard_url.startswith("http://") else f"http://{dashboard_url}"
    health = (f"python -c \"import urllib.request; r=urllib.request.urlopen('{address}/api/gcs_healthz', timeout=10);"
              " exit(0 if b'success' in r.read() else 1)\"")
    entrypoint = rayjob["spec"]["entrypoint"].strip()
    cmd = ["until", health, ">/dev/null", "2>&1", ";", "do", "echo",
           json.dumps(f"Waiting for Ray Dashboard GCS to become healthy at {address} ..."), ";", "sleep", "2", ";",
           "done", ";", "if", "!", "ray", "job", "status", "--address", address, job_id, ">/dev/null", "2>&1", ";",
           "then", "ray", "job", "submit", "--address", address, "--no-wait", "--submission-id", job_id, "--",
           entrypoint, ";", "fi", ";", "ray", "job", "logs", "--address", address, "--follow", job_id]
    template = rayjob["spec"].get("submitterPodTemplate", {"spec": {"containers": [{}]}})
    container = template["spec"]["containers"][0]
    env = template_env(container, secrets, {})
    env["PYTHONUNBUFFERED"] = "1"
    env["RAY_DASHBOARD_ADDRESS"] = dashboard_url
    env["RAY_JOB_SUBMISSION_ID"] = job_id
    if auth_secret:
        env.setdefault("RAY_AUTH_MODE", "token")
        env.setdefault("RAY_AUTH_TOKEN", base64.b64decode(secrets[auth_secret]["auth_token"]).decode())
    joined = " ".join(cmd)
    return RayContainer([*container_command(extra="e"), joined], env)


# --- the operator creating the pods of one RayJob attempt ------------------------------------------------------------
@dataclass
class RayJobSim:
    """One RayJob attempt as pod stand-ins: head (init containers, then Ray), one pod per worker replica, and the
    K8sJobMode submitter (created by ``submit()``). ``image_env`` is what the image sets (PATH, HOME ...)."""

    rayjob: Mapping[str, Any]
    net: Network
    root: Path
    volumes: Volumes
    image_env: Mapping[str, str]
    namespace: str
    login_shell: bool = False
    cluster: str = ""
    pods: list[Pod] = field(default_factory=list)
    head: Pod | None = None
    workers: list[Pod] = field(default_factory=list)
    submitter: Pod | None = None
    name: str = field(init=False)
    spec: Mapping[str, Any] = field(init=False)  # rayClusterSpec
    auth_secret: str | None = field(init=False)  # the token Secret KubeRay injects (authOptions.mode: token)
    job_id: str = field(init=False)

    def __post_init__(self) -> None:
        self.name = self.rayjob["metadata"]["name"]
        self.cluster = self.cluster or cluster_name(self.name)
        self.spec = self.rayjob["spec"]["rayClusterSpec"]
        auth = self.spec.get("authOptions") or {}
        self.auth_secret = (auth.get("secretName") or self.cluster) if auth.get("mode") == "token" else None
        self.job_id = f"{self.name}-sim01"

    def _pod(self, name: str, labels: Mapping[str, str]) -> Pod:
        pod = Pod(self.net, name, self.namespace, labels, self.root)
        self.pods.append(pod)
        return pod

    def _env(self, own: Mapping[str, str]) -> dict[str, str]:
        return {**self.image_env, **own}

    def create_pods(self) -> None:
        """Create every pod's network identity first (IPs, service DNS), so policies can be applied before start."""
        head_labels = pod_labels(self.spec["headGroupSpec"]["template"]["metadata"].get("labels", {}), "head",
                                 self.cluster, "headgroup")
        self.head = self._pod(f"{self.cluster}-head", head_labels)
        self.net.add_dns(head_service_fqdn(self.cluster, self.namespace), self.head.ip)
        self.net.add_dns(rayjob_dashboard_url(self.name, self.namespace).split(":")[0], self.head.ip)
        for g in self.spec.get("workerGroupSpecs", []):
            labels = pod_labels(g["template"]["metadata"].get("labels", {}), "worker", self.cluster, g["groupName"])
            for i in range(int(g.get("replicas", 1))):
                self.workers.append(self._pod(f"{self.cluster}-{g['groupName']}-worker-{i}", labels))
        template = self.rayjob["spec"].get("submitterPodTemplate") or {"metadata": {}}
        self.submitter = self._pod(f"{self.name}-submitter", submitter_labels(
            template["metadata"].get("labels", {}), self.name))

    def _ray_container(self, pod: Pod, group_spec: Mapping[str, Any], node_type: str, group: str) -> Container:
        rc = ray_container(group_spec, node_type, cluster=self.cluster, namespace=self.namespace, pod_name=pod.name,
                           group=group, head_port=head_port(self.spec), secrets=self.volumes.secrets,
                           auth_secret=self.auth_secret, login_shell=self.login_shell)
        spec = group_spec["template"]["spec"]
        c = spec["containers"][0]
        return Container(c["name"], rc.argv, self._env(rc.env), container_mounts(spec, c, self.volumes, pod.dir),
                         read_only_root(c))

    def start_head(self, init_timeout: float = 300) -> list[Exited]:
        """Run the head's init containers to completion (each must exit 0), then start its Ray container."""
        assert self.head is not None
        spec = self.spec["headGroupSpec"]["template"]["spec"]
        done = []
        for ic in spec.get("initContainers", []):
            env = self._env(template_env(ic, self.volumes.secrets, {}))
            argv = list(ic.get("command", [])) + list(ic.get("args", []))
            mounts = container_mounts(spec, ic, self.volumes, self.head.dir)
            result = self.head.run(Container(ic["name"], argv, env, mounts, read_only_root(ic)), init_timeout)
            done.append(result)
            if result.rc != 0:
                raise RuntimeError(f"init container {ic['name']} exited {result.rc}:\n{result.out[-3000:]}")
        self.head.start(self._ray_container(self.head, self.spec["headGroupSpec"], "head", "headgroup"))
        return done

    def pod_spec(self, pod: Pod) -> Mapping[str, Any]:
        """The rendered pod template spec ``pod`` was made from."""
        if pod is self.head:
            return self.spec["headGroupSpec"]["template"]["spec"]
        if pod in self.workers:
            return self._worker_groups()[self.workers.index(pod)]["template"]["spec"]
        raise ValueError(f"{pod.name} is not a Ray pod of this RayJob")

    def stop(self, pod: Pod) -> Termination:
        """Stop a Ray pod as the kubelet would on eviction: the rendered ``preStop`` exec command of its Ray
        container, then SIGTERM, SIGKILL at the rendered ``terminationGracePeriodSeconds`` (Kubernetes' default 30)."""
        spec = self.pod_spec(pod)
        hook = spec["containers"][0].get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command")
        return pod.terminate(float(spec.get("terminationGracePeriodSeconds", 30)), hook)

    def start_workers(self, init_timeout: float = 300) -> None:
        """Each worker pod: KubeRay's ``wait-gcs-ready`` init container (until the head's GCS answers), then Ray.
        The init containers of all workers run side by side, as the kubelets of different nodes would."""
        pods = iter(self.workers)
        started = []
        for g in self.spec.get("workerGroupSpecs", []):
            for _ in range(int(g.get("replicas", 1))):
                pod = next(pods)
                main = self._ray_container(pod, g, "worker", g["groupName"])
                script = wait_gcs_ready_script(head_service_fqdn(self.cluster, self.namespace), head_port(self.spec))
                # DefaultWorkerPodTemplate: the Ray container's volumeMounts and securityContext
                wait = Container("wait-gcs-ready", [*container_command(self.login_shell), script], main.env,
                                 main.mounts, main.read_only_root)
                started.append((pod, pod.launch(wait), main))
        for pod, proc, main in started:
            result = pod.finish(proc, init_timeout)
            if result.rc != 0:
                raise RuntimeError(f"{pod.name}: wait-gcs-ready exited {result.rc}:\n{result.out[-3000:]}")
            pod.start(main)

    def wait_ready(self, timeout: float = 180) -> None:
        """Until every Ray pod passes KubeRay's readiness probe (Ray >= 2.53: HTTP GET /api/healthz on the dashboard
        agent port, sent by the kubelet from the node), as KubeRay waits before it creates the submitter."""
        deadline = time.monotonic() + timeout
        for pod, group in [(self.head, self.spec["headGroupSpec"])] + [
            (p, g) for p, g in zip(self.workers, self._worker_groups(), strict=True)
        ]:
            assert pod is not None
            port = group.get("rayStartParams", {}).get("dashboard-agent-listen-port",
                                                       DEFAULT_DASHBOARD_AGENT_LISTEN_PORT)
            while not self.net.http_ok(f"http://{pod.ip}:{port}/api/healthz"):
                if not pod.running() or time.monotonic() > deadline:
                    raise RuntimeError(f"{pod.name} never became ready:\n{pod.log()[-3000:]}")
                time.sleep(1)

    def _worker_groups(self) -> list[Mapping[str, Any]]:
        return [g for g in self.spec.get("workerGroupSpecs", []) for _ in range(int(g.get("replicas", 1)))]

    def submit(self) -> None:
        """Start the K8sJobMode submitter pod (KubeRay creates it once the cluster is up)."""
        assert self.submitter is not None
        rc = submitter_container(self.rayjob, job_id=self.job_id,
                                 dashboard_url=rayjob_dashboard_url(self.name, self.namespace),
                                 secrets=self.volumes.secrets, auth_secret=self.auth_secret)
        template = self.rayjob["spec"].get("submitterPodTemplate") or {"spec": {"containers": [{}]}}
        spec = template["spec"]
        c = spec["containers"][0]
        self.submitter.start(Container("ray-job-submitter", rc.argv, self._env(rc.env),
                                       container_mounts(spec, c, self.volumes, self.submitter.dir), read_only_root(c)))

    def close(self) -> None:
        for pod in reversed(self.pods):
            pod.close()
