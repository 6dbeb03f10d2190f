"""What a bundle must share with the config that resumes it (checked by verify/preflight and the driver).

Not listed, on purpose: the trainer count and ``trainer.strategy`` (hf policies reshard on load), ``model.path``
and ``model.dtype`` (the policy's weights come from the bundle; a model they do not fit is refused when the
trainers load it), and the dataset file itself (its sha256 is checked separately, so the refusal can say how to
accept a changed file: ``task.allow_changed_dataset``).

``data_plane.storage_units`` is recorded but binds only a bundle whose data plane cannot be re-routed
(TransferQueue's native pickles restore into the unit count that wrote them): the streamed format holds every row
with its data and puts each back through TransferQueue's own routing, so it restores into any unit count
(``REROUTABLE_KEYS``; ``tests/integration/data_plane/test_reroute.py``).
"""

from __future__ import annotations

from typing import Any

from sc_app.config.app import AppConfig
from sc_app.config.tree import RENAMED_KEYS

TINY_MODEL_KEYS = ("vocab_size", "d_model", "n_layers", "n_heads", "max_seq_len")
# Keys a bundle records only since a later sc-app version: one that does not record such a key was written with
# this value (so bundles cut before ``model.backend`` existed still resume with the tiny default).
RECORDED_SINCE = {"model.backend": "tiny"}
# Keys a bundle whose data plane re-routes its rows on restore (the streamed formats) need not share.
REROUTABLE_KEYS = frozenset({"data_plane.storage_units"})
# Keys a bundle cut before a config key was renamed records under the old name: new name → old name.
RECORDED_AS = {new: old for old, new in RENAMED_KEYS.items()}


def compat_of(cfg: AppConfig) -> dict[str, Any]:
    """Config keys whose change makes an existing bundle unresumable, named as config keys."""
    keys: dict[str, Any] = {
        "run.seed": cfg.run.seed,
        "data_plane.partition": cfg.data_plane.partition,
        "data_plane.storage_units": cfg.data_plane.storage_units,
        "grpo.group_size": cfg.grpo.group_size,
        "task.name": cfg.task.name,
        "task.prompt_len": cfg.task.prompt_len,
        "task.response_len": cfg.task.response_len,
        "model.backend": cfg.model.backend,
    }
    if cfg.model.backend == "tiny":
        keys.update({f"model.{k}": getattr(cfg.model, k) for k in TINY_MODEL_KEYS})
    if cfg.task.name == "jsonl":
        keys["task.shuffle"] = cfg.task.shuffle  # the order the loader place counts in
    return keys


def binding_keys(expected: dict[str, Any], *, reroutes: bool) -> dict[str, Any]:
    """The part of ``expected`` (``compat_of``) a bundle must match: without the unit count when its data plane
    re-routes rows on restore (``reroutes``: a streamed snapshot)."""
    if not reroutes:
        return expected
    return {k: v for k, v in expected.items() if k not in REROUTABLE_KEYS}
