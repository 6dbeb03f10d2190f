"""Kubernetes side of sc-app: build the chart's objects from values and drive a RayJob through the API server.

``release`` renders the same Helm chart (``helm/sc-app``) with the embedded Helm engine, so a pipeline without Helm
gets byte-for-byte the objects ``helm install`` would create. ``api`` talks to the API server (bounded requests,
discovery, one-line errors) through the official ``kubernetes`` client's configuration and transport. ``install``
creates and removes a release's objects, ``rayjob`` reads and steers one RayJob, ``live`` asks the running head's
Ray Jobs API through the API server's service proxy, ``driver_log`` reads the driver's output lines, and ``cli``
adds ``sc-app k8s ...``. Nothing here is imported by the training runtime.
"""
