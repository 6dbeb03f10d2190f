"""The checkpoint bundle: layout, durable writing, manifest, verification, resume planning, retention, lease.

What a bundle holds and the order it is written in: ``docs/checkpoint.md``.
"""

from sc_app.checkpoint.manifest import Manifest, ManifestError, hmac_key_from_env, read_manifest
from sc_app.checkpoint.resume import ResumePlan, plan_resume
from sc_app.checkpoint.retention import prune
from sc_app.checkpoint.verify import BundleReport, verify_bundle
from sc_app.checkpoint.writer import BundleExistsError, BundleWriter

__all__ = [
    "BundleExistsError",
    "BundleReport",
    "BundleWriter",
    "Manifest",
    "ManifestError",
    "ResumePlan",
    "hmac_key_from_env",
    "plan_resume",
    "prune",
    "read_manifest",
    "verify_bundle",
]
