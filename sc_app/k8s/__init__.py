"""Kubernetes side of sc-app: build the chart's objects from values and drive a RayJob through the API server.

``manifest`` renders the same Helm chart (``helm/sc-app``) with the embedded Helm engine, so a pipeline without Helm
gets byte-for-byte the objects ``helm install`` would create. ``api`` talks to the API server with the official
``kubernetes`` client and turns its errors into one line each. ``cli`` adds ``sc-app k8s ...``.
Nothing here is imported by the training runtime.
"""
