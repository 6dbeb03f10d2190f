"""TCP reachability probes between pod stand-ins (run inside a pod's network namespace with ``ip netns exec``).

``python tcp_probe.py listen PORT...``: accept (and close) connections on every port until killed; prints "ready".
``python tcp_probe.py connect TIMEOUT HOST:PORT...``: try every address at once; prints a JSON object
``{"HOST:PORT": true|false}`` (true = the connection was established within TIMEOUT seconds).
"""

from __future__ import annotations

import json
import selectors
import socket
import sys
import time


def listen(ports: list[int]) -> None:
    sel = selectors.DefaultSelector()
    for port in ports:
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("0.0.0.0", port))
        s.listen(64)
        sel.register(s, selectors.EVENT_READ)
    print("ready", flush=True)
    while True:
        for key, _ in sel.select():
            conn, _ = key.fileobj.accept()  # type: ignore[union-attr]
            conn.close()


def connect(timeout: float, targets: list[str]) -> dict[str, bool]:
    sel = selectors.DefaultSelector()
    result = dict.fromkeys(targets, False)
    for target in targets:
        host, port = target.rsplit(":", 1)
        s = socket.socket()
        s.setblocking(False)
        s.connect_ex((host, int(port)))
        sel.register(s, selectors.EVENT_WRITE, target)
    deadline = time.monotonic() + timeout
    while sel.get_map() and (left := deadline - time.monotonic()) > 0:
        for key, _ in sel.select(left):
            sock: socket.socket = key.fileobj  # type: ignore[assignment]
            result[key.data] = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0
            sel.unregister(sock)
            sock.close()
    return result


if __name__ == "__main__":
    if sys.argv[1] == "listen":
        listen([int(p) for p in sys.argv[2:]])
    else:
        print(json.dumps(connect(float(sys.argv[2]), sys.argv[3:])))
