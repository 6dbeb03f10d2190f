"""The cluster DNS stand-in of ``podsim.Network``: answers A queries for the names in a JSON file (name → IPv4),
NXDOMAIN for anything else, no AAAA records. Run as ``python cluster_dns.py BIND_IP NAMES_JSON`` inside the node's
network namespace; the file is re-read on every query, so names registered later resolve too.

Needed because gRPC (Ray's GCS client) resolves with c-ares, which asks a DNS server rather than ``/etc/hosts``.
"""

from __future__ import annotations

import json
import socket
import struct
import sys
from pathlib import Path

NXDOMAIN = 3
TTL_S = 5


def answer(query: bytes, names: dict[str, str]) -> bytes:
    """The response to one DNS query message (a single question, as resolvers send)."""
    tid, flags = struct.unpack(">HH", query[:4])
    i, labels = 12, []
    while query[i]:
        length = query[i]
        labels.append(query[i + 1 : i + 1 + length].decode("ascii", "replace"))
        i += 1 + length
    qtype, _qclass = struct.unpack(">HH", query[i + 1 : i + 5])
    question = query[12 : i + 5]
    ip = names.get(".".join(labels).lower().rstrip("."))
    record = b""
    if ip is not None and qtype == 1:
        record = b"\xc0\x0c" + struct.pack(">HHIH", 1, 1, TTL_S, 4) + socket.inet_aton(ip)
    rflags = 0x8000 | 0x0400 | (flags & 0x0100) | 0x0080 | (0 if ip is not None else NXDOMAIN)
    return struct.pack(">HHHHHH", tid, rflags, 1, 1 if record else 0, 0, 0) + question + record


def serve(bind_ip: str, names_file: Path) -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind((bind_ip, 53))
    while True:
        query, peer = sock.recvfrom(4096)
        try:
            names = json.loads(names_file.read_text())
            sock.sendto(answer(query, names), peer)
        except (ValueError, IndexError, struct.error, OSError):
            continue


if __name__ == "__main__":
    serve(sys.argv[1], Path(sys.argv[2]))
