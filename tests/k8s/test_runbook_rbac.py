"""The Roles in ops/README.md hold exactly what is used (issue 27 part 8): ``sc-app-k8s`` = the requests a session
of ``sc-app k8s`` verbs makes against the API-server stand-in (Kueue stand-in included), ``sc-app-runbooks`` = what
the ``kubectl`` commands of RUNBOOKS.md and ops/ckpt-shell.sh need, derived command by command (a command this
table does not know fails the test, so a new runbook command cannot slip past the Role)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import yaml

from sc_app.k8s.cli import main
from tests.k8s.fake_apiserver import FakeApiServer, write_kubeconfig
from tests.k8s.k8s_helpers import CHART_DIR, REPO_ROOT, load_values
from tests.k8s.kueue_sim import KueueSim

Need = tuple[str, str, str]  # (api group, resource, verb)
README = REPO_ROOT / "ops" / "README.md"


def role(name: str) -> set[Need]:
    """The rules of the Role ``name`` in ops/README.md as (group, resource, verb)."""
    for block in re.findall(r"```yaml\n(.*?)```", README.read_text(), re.S):
        doc = yaml.safe_load(block)
        if isinstance(doc, dict) and doc.get("kind") == "Role" and doc["metadata"]["name"] == name:
            return {(g, r, v) for rule in doc["rules"] for g in rule["apiGroups"] for r in rule["resources"]
                    for v in rule["verbs"]}
    raise AssertionError(f"no Role {name} in {README}")


def recorded(server: FakeApiServer) -> set[Need]:
    out: set[Need] = set()
    for method, path, _ in server.requests:
        parts = [p for p in path.split("/") if p]
        if "namespaces" not in parts:
            continue  # discovery, cluster-scoped StorageClass (the optional ClusterRole)
        rest = parts[parts.index("namespaces") + 2:]
        group = parts[1] if parts[0] == "apis" else ""
        resource = rest[0] + (f"/{rest[2]}" if len(rest) > 2 else "")
        verb = {"GET": "get" if len(rest) > 1 else "list", "POST": "create", "PUT": "update", "PATCH": "patch",
                "DELETE": "delete"}[method]
        out.add((group, resource, verb))
    return out


def cli_session(tmp_path: Path) -> set[Need]:
    """submit, resubmit over stale companions, status, suspend --wait, resume and delete of a Kueue-queued job."""
    server = FakeApiServer(kuberay_suspends=True)
    KueueSim().install(server)
    url = server.start()
    try:
        write_kubeconfig(str(tmp_path / "kc"), url)
        values = load_values(CHART_DIR / "ci" / "cpu-values.yaml") | {"labels": {"kueue.x-k8s.io/queue-name": "q"}}
        (tmp_path / "v.yaml").write_text(yaml.safe_dump(values))
        common = ["demo", "-n", "ml", "--kubeconfig", str(tmp_path / "kc"), "-f", str(tmp_path / "v.yaml")]
        fast = ["--poll", "0.02", "--timeout", "20"]
        assert main(["k8s", "submit", *common]) == 0
        del server.store[("rayjobs", "ml", "demo-sc-app")]  # companions left behind: a resubmit replaces them
        assert main(["k8s", "submit", *common]) == 0
        job = server.store[("rayjobs", "ml", "demo-sc-app")]
        job["status"] = {"jobDeploymentStatus": "Running", "rayClusterName": "demo-x", "jobId": "j",
                         "dashboardURL": "demo-x-head-svc.ml.svc:8265"}
        server.add("pods", {"apiVersion": "v1", "kind": "Pod", "metadata": {
            "name": "demo-x-head", "labels": {"ray.io/cluster": "demo-x", "ray.io/node-type": "head"}}})
        for verb, extra in (("status", []), ("suspend", ["--wait", *fast]), ("resume", fast), ("delete", fast)):
            assert main(["k8s", verb, *common, *extra]) == 0, verb
        return recorded(server)
    finally:
        server.stop()


def test_the_sc_app_k8s_role_is_exactly_what_the_verbs_request(tmp_path: Path) -> None:
    used = cli_session(tmp_path)
    granted = role("sc-app-k8s")
    assert used <= granted, f"requests the Role does not grant: {sorted(used - granted)}"
    assert granted <= used, f"granted but never requested: {sorted(granted - used)}"


# kubectl verb (and kind) → what it needs, in the simple model of kubectl's requests.
WAITS = {"get", "list", "watch"}
KINDS = {"rayjob": ("ray.io", "rayjobs"), "pod": ("", "pods"), "pvc": ("", "persistentvolumeclaims")}


def kubectl_needs(words: list[str]) -> set[Need]:
    """What one ``kubectl`` command needs (``words`` without flags' values)."""
    verb = words[0]
    kind = next((KINDS[w.split("/")[0]] for w in words[1:] if w.split("/")[0] in KINDS), None)
    if verb in ("exec", "cp"):
        return {("", "pods", "get"), ("", "pods/exec", "create")}
    if verb == "logs":
        return {("", "pods", "list"), ("", "pods/log", "get")}
    if verb in ("create", "run"):
        return {("", "pods", "create")}
    if verb == "apply" and kind is None:  # the §10 claim from a heredoc
        return {("", "persistentvolumeclaims", v) for v in ("get", "create", "patch")}
    assert kind is not None, f"kubectl command this test does not know: {words}"
    group, resource = kind
    table = {"get": {"get"} | ({"list", "watch"} if "-w" in words else set()), "delete": {"delete"} | WAITS,
             "patch": {"get", "patch"}, "wait": WAITS}
    assert verb in table, f"kubectl command this test does not know: {words}"
    return {(group, resource, v) for v in table[verb]} | ({("", "pods", "list")} if "-l" in words else set())


def kubectl_commands() -> list[list[str]]:
    """Every kubectl command of RUNBOOKS.md (code blocks and inline code) and ckpt-shell.sh, operator's excluded."""
    text = (REPO_ROOT / "ops" / "RUNBOOKS.md").read_text() + (REPO_ROOT / "ops" / "ckpt-shell.sh").read_text()
    text = text.replace("\\\n", " ")
    out = []
    for m in re.finditer(r"kubectl (-n [^\n`#|>]*)", text):
        line = m.group(1).replace("${", "").replace("}", "")
        try:
            args = shlex.split(line)
        except ValueError:
            args = line.split()
        if not args or "kuberay-system" in args or args[:2] == ["get", "crd"] or "-it" in args:
            continue  # the operator's namespace and CRDs: a cluster admin's; -it: ckpt-shell's hint line
        valued = {"-n", "-c", "-o", "-p", "--type", "--image", "--restart", "--overrides", "--for", "--timeout"}
        words = [a for i, a in enumerate(args) if not a.startswith("-") and (i == 0 or args[i - 1] not in valued)]
        words += [a for a in args if a in ("-w", "-l")]
        if words and words[0] not in ("-n",) and not words[0].startswith("$"):
            out.append(words)
    return out


def test_the_runbook_role_is_exactly_what_the_runbooks_kubectl_commands_need() -> None:
    commands = kubectl_commands()
    assert any(c[0] == "exec" for c in commands) and any(c[0] == "cp" for c in commands)
    needed = set().union(*(kubectl_needs(c) for c in commands))
    granted = role("sc-app-runbooks")
    assert ("", "pods/exec", "create") in needed
    assert needed == granted, f"missing: {sorted(needed - granted)}; unused: {sorted(granted - needed)}"


@pytest.mark.parametrize("words", [["exec", "x"], ["get", "rayjob", "x", "-w"], ["delete", "pvc", "x"]])
def test_the_kubectl_model_knows_the_runbook_verbs(words: list[str]) -> None:
    assert kubectl_needs(words)
