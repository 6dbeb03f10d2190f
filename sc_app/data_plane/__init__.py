"""Data-plane clients (seed flows 1, 3, 4, 5): the abstract client and the TransferQueue adapter."""

from sc_app.data_plane.client import DataPlaneClient, RestoreOrderError, RestoreRefused

__all__ = ["DataPlaneClient", "RestoreOrderError", "RestoreRefused"]
