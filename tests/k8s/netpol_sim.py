"""NetworkPolicy → nftables, the way a policy-enforcing CNI (Calico, Cilium) applies it to a pod's ingress.

Generic: it reads rendered ``networking.k8s.io/v1`` NetworkPolicy objects and a list of pod stand-ins (namespace,
labels, IP, named container ports) and computes, for each pod, which (source IPs, protocol, port range) may open a
connection to it; everything else is dropped and counted per (source, protocol, port).

Semantics (Kubernetes API reference, NetworkPolicy): a pod selected by no policy with ``Ingress`` in its
``policyTypes`` is not isolated (accept all); a selected pod accepts the union of the ingress rules of every policy
that selects it; a rule without ``from`` admits every source, without ``ports`` every port and protocol; a peer with
only ``podSelector`` means pods of the policy's namespace, with only ``namespaceSelector`` every pod of the matching
namespaces, with both the matching pods of the matching namespaces; ``ipBlock`` is a CIDR minus ``except``.
Replies of admitted connections are admitted (connection tracking), traffic a pod sends itself is not filtered.

What it refuses rather than guesses (``PolicyTranslationError``): egress policies, unknown selector operators,
named ports no destination container declares. Only the stand-ins' IPs exist on the simulated network, so every
peer resolves to a set of those IPs.
"""

from __future__ import annotations

import ipaddress
import json
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

TABLE = "scnp_netpol"
PROTOCOLS = ("tcp", "udp", "sctp")


class PolicyTranslationError(ValueError):
    """The policy uses something this translation cannot enforce faithfully."""


@dataclass(frozen=True)
class PodRef:
    """A pod as NetworkPolicy sees it. ``ports``: named container ports, name → (protocol, number)."""

    name: str
    namespace: str
    labels: Mapping[str, str]
    ip: str
    ports: Mapping[str, tuple[str, int]] = field(default_factory=dict)


@dataclass(frozen=True)
class PortRange:
    """``protocol`` lower-case; ``first``/``last`` None = every port of that protocol."""

    protocol: str
    first: int | None = None
    last: int | None = None

    def nft(self) -> str:
        if self.first is None:
            return f"meta l4proto {self.protocol}"
        span = str(self.first) if self.last in (None, self.first) else f"{self.first}-{self.last}"
        return f"meta l4proto {self.protocol} th dport {span}"

    def admits(self, protocol: str, port: int) -> bool:
        if protocol != self.protocol:
            return False
        return self.first is None or self.first <= port <= (self.last if self.last is not None else self.first)


@dataclass(frozen=True)
class Allow:
    """One ingress rule resolved for one pod. ``sources`` None = any source; ``ports`` None = every port."""

    origin: str  # "<policy>/ingress[<i>]", for reports
    sources: frozenset[str] | None
    ports: tuple[PortRange, ...] | None

    def admits(self, src: str, protocol: str, port: int) -> bool:
        if self.sources is not None and src not in self.sources:
            return False
        return self.ports is None or any(p.admits(protocol, port) for p in self.ports)


@dataclass(frozen=True)
class Ingress:
    """What a pod admits. ``isolated`` False = no policy selects it (everything is admitted)."""

    pod: PodRef
    isolated: bool
    allows: tuple[Allow, ...] = ()

    def admits(self, src: str, protocol: str, port: int) -> bool:
        return not self.isolated or any(a.admits(src, protocol, port) for a in self.allows)


@dataclass(frozen=True)
class Attempt:
    """Packets that opened, or tried to open, connections to ``pod`` from one source to one protocol/port
    (``attempts()``: all of them; ``drops()``: those the policy dropped)."""

    pod: str
    source: str
    protocol: str
    port: int
    packets: int

    def __str__(self) -> str:
        return f"{self.source} -> {self.pod} {self.protocol}/{self.port}: {self.packets} packets"


def selector_matches(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """``metav1.LabelSelector`` semantics; an empty selector matches everything."""
    selector = selector or {}
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], set(expr.get("values") or [])
        if op == "In":
            ok = key in labels and labels[key] in values
        elif op == "NotIn":
            ok = key not in labels or labels[key] not in values
        elif op == "Exists":
            ok = key in labels
        elif op == "DoesNotExist":
            ok = key not in labels
        else:
            raise PolicyTranslationError(f"unknown label selector operator {op!r}")
        if not ok:
            return False
    return True


def _namespace_labels(namespace: str, extra: Mapping[str, Mapping[str, str]]) -> dict[str, str]:
    return {"kubernetes.io/metadata.name": namespace, **extra.get(namespace, {})}


def peer_ips(
    peer: Mapping[str, Any], policy_namespace: str, pods: Sequence[PodRef],
    namespace_labels: Mapping[str, Mapping[str, str]] | None = None,
) -> frozenset[str]:
    """The stand-in IPs one ``NetworkPolicyPeer`` admits."""
    extra = namespace_labels or {}
    if "ipBlock" in peer:
        block = peer["ipBlock"]
        net = ipaddress.ip_network(block["cidr"], strict=False)
        excluded = [ipaddress.ip_network(e, strict=False) for e in block.get("except") or []]
        return frozenset(
            p.ip for p in pods
            if ipaddress.ip_address(p.ip) in net and not any(ipaddress.ip_address(p.ip) in e for e in excluded)
        )
    if "podSelector" not in peer and "namespaceSelector" not in peer:
        raise PolicyTranslationError(f"peer without podSelector, namespaceSelector or ipBlock: {peer}")
    out = set()
    for p in pods:
        if "namespaceSelector" in peer:
            if not selector_matches(peer["namespaceSelector"], _namespace_labels(p.namespace, extra)):
                continue
        elif p.namespace != policy_namespace:
            continue
        if "podSelector" in peer and not selector_matches(peer["podSelector"], p.labels):
            continue
        out.add(p.ip)
    return frozenset(out)


def _port_ranges(ports: Iterable[Mapping[str, Any]], dest: PodRef) -> tuple[PortRange, ...]:
    out = []
    for port in ports:
        protocol = str(port.get("protocol", "TCP")).lower()
        if protocol not in PROTOCOLS:
            raise PolicyTranslationError(f"unknown protocol {port.get('protocol')!r}")
        number = port.get("port")
        if number is None:
            out.append(PortRange(protocol))
            continue
        if isinstance(number, str) and not number.isdigit():
            if number not in dest.ports or dest.ports[number][0] != protocol:
                continue  # a named port the destination does not declare admits nothing there
            number = dest.ports[number][1]
        first = int(number)
        out.append(PortRange(protocol, first, int(port.get("endPort", first))))
    return tuple(out)


def ingress_for(
    pod: PodRef, policies: Sequence[Mapping[str, Any]], pods: Sequence[PodRef],
    namespace_labels: Mapping[str, Mapping[str, str]] | None = None,
) -> Ingress:
    """Resolve every policy that selects ``pod`` into its admitted (sources, ports)."""
    allows: list[Allow] = []
    isolated = False
    for policy in policies:
        meta, spec = policy["metadata"], policy["spec"]
        namespace = meta["namespace"]  # set it as the API server would (``helm template`` leaves it out)
        if namespace != pod.namespace or not selector_matches(spec.get("podSelector"), pod.labels):
            continue
        types = spec.get("policyTypes") or (["Ingress"] + (["Egress"] if spec.get("egress") else []))
        if "Egress" in types:
            raise PolicyTranslationError(f"{meta['name']}: egress rules are not translated")
        if "Ingress" not in types:
            continue
        isolated = True
        for i, rule in enumerate(spec.get("ingress") or []):
            sources = None
            if rule.get("from"):
                sources = frozenset().union(*(peer_ips(p, namespace, pods, namespace_labels) for p in rule["from"]))
            ports = _port_ranges(rule["ports"], pod) if rule.get("ports") else None
            allows.append(Allow(f"{meta['name']}/ingress[{i}]", sources, ports))
    return Ingress(pod, isolated, tuple(allows))


def nft_ruleset(ingress: Ingress, node_ips: Sequence[str] = ()) -> str:
    """The pod-side nftables table for one pod (empty string when the pod is not isolated). ``node_ips``: the
    node's own addresses, always admitted (kubelet probes; what Calico and Cilium do by default)."""
    if not ingress.isolated:
        return ""
    lines = [
        f"table inet {TABLE} {{",
        "  set dropped { type ipv4_addr . inet_proto . inet_service; flags dynamic; counter; size 65535; }",
        "  set opened { type ipv4_addr . inet_proto . inet_service; flags dynamic; counter; size 65535; }",
        "  chain ingress {",
        "    type filter hook input priority filter; policy accept;",
        "    ct state established,related accept",
        '    iifname "lo" accept',
        "    meta l4proto { tcp, udp, sctp } add @opened { ip saddr . meta l4proto . th dport }",
    ]
    if node_ips:
        lines.append(f"    ip saddr {{ {', '.join(node_ips)} }} accept comment \"node (kubelet probes)\"")
    for allow in ingress.allows:
        if allow.sources is not None and not allow.sources:
            continue  # a peer that matches no pod admits nothing
        src = "" if allow.sources is None else f"ip saddr {{ {', '.join(sorted(allow.sources))} }} "
        for port in allow.ports if allow.ports is not None else [None]:
            match = f"{src}{port.nft() if port else ''}".strip()
            lines.append(f"    {match} accept comment \"{allow.origin}\"")
    lines += [
        "    meta l4proto { tcp, udp, sctp } add @dropped { ip saddr . meta l4proto . th dport } drop",
        "    counter drop",
        "  }",
        "}",
    ]
    return "\n".join(lines) + "\n"


def apply(netns: str, ingress: Ingress, node_ips: Sequence[str] = ()) -> None:
    """Replace the pod's filter table with the one for ``ingress`` (no table when it is not isolated)."""
    subprocess.run(["ip", "netns", "exec", netns, "nft", "delete", "table", "inet", TABLE],
                   capture_output=True, check=False)
    ruleset = nft_ruleset(ingress, node_ips)
    if ruleset:
        subprocess.run(["ip", "netns", "exec", netns, "nft", "-f", "-"], input=ruleset, text=True, check=True,
                       capture_output=True)


_PROTO_NAMES = {6: "tcp", 17: "udp", 132: "sctp"}


def drops(netns: str, pod: str) -> list[Attempt]:
    """Dropped connection attempts recorded on the pod's ingress so far (empty when it is not isolated)."""
    return _counted(netns, pod, "dropped")


def attempts(netns: str, pod: str) -> list[Attempt]:
    """Every new connection attempt to the pod so far, admitted or not (empty when it is not isolated)."""
    return _counted(netns, pod, "opened")


def _counted(netns: str, pod: str, set_name: str) -> list[Attempt]:
    proc = subprocess.run(["ip", "netns", "exec", netns, "nft", "-j", "list", "set", "inet", TABLE, set_name],
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        return []
    out = []
    for item in json.loads(proc.stdout)["nftables"]:
        for elem in item.get("set", {}).get("elem", []):
            src, proto, port = elem["elem"]["val"]["concat"]
            proto = _PROTO_NAMES.get(proto, str(proto)) if isinstance(proto, int) else str(proto)
            out.append(Attempt(pod, src, proto, int(port), int(elem["elem"]["counter"]["packets"])))
    return sorted(out, key=lambda d: (d.pod, d.source, d.protocol, d.port))
