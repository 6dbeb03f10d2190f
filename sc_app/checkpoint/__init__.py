"""The checkpoint bundle: layout, durable writing, manifest, verification, resume planning, retention, lease.

What a bundle holds and the order it is written in: ``docs/checkpoint.md``. Which bundle a command or a run may
use is one decision, ``choose_bundle`` under a directory's ``BundleRules``, returning a ``ResumePlan`` (``decision``:
``resume`` / ``fresh`` / ``refuse``, with its reason); ``plan_resume`` is the walk over the bundles it runs.
"""

from sc_app.checkpoint.manifest import Manifest, ManifestError, hmac_key_from_env, read_manifest
from sc_app.checkpoint.resume import Decision, ResumePlan, plan_resume
from sc_app.checkpoint.retention import prune
from sc_app.checkpoint.selection import BundleRules, OnCorrupt, choose_bundle
from sc_app.checkpoint.verify import BundleReport, verify_bundle
from sc_app.checkpoint.writer import BundleExistsError, BundleWriter

__all__ = [
    "BundleExistsError",
    "BundleReport",
    "BundleRules",
    "BundleWriter",
    "Decision",
    "Manifest",
    "ManifestError",
    "OnCorrupt",
    "ResumePlan",
    "choose_bundle",
    "hmac_key_from_env",
    "plan_resume",
    "prune",
    "read_manifest",
    "verify_bundle",
]
