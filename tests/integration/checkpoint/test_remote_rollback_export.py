"""``sc-app ckpt rollback --remote`` and ``sc-app export --remote`` against the real radosgw: the local commands'
safety rules on the bucket (a target that verifies or nothing changes, quarantine instead of delete, a foreign
lineage never a target nor exported, a run still writing there fenced, the record changed only by compare-and-swap).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from sc_app.checkpoint.remote.fence import BUNDLES, RemoteLeaseLost, acquire, read_record
from sc_app.checkpoint.remote.probe import open_bucket
from sc_app.checkpoint.remote.upload import upload_bundle
from sc_app.checkpoint.writer import BundleWriter
from tests.support.bundles import make_bundle, write_contents
from tests.support.cli import InProcess

LINEAGE = "lineage-rollback"


def flags(cfg: Any) -> list[str]:
    return ["--remote", cfg.url, "--endpoint", cfg.endpoint, "--region", cfg.region, "--addressing-style", "path"]


def listed(cli: InProcess, cfg: Any) -> dict[str, Any]:
    out = cli("ckpt", "list", *flags(cfg), "--json")
    assert out.rc == 0, out.out
    return json.loads(out.stdout)


def objects(store: Any, upload_dir: str) -> list[str]:
    return [k for k, _ in store.list(store.key(BUNDLES, upload_dir) + "/")]


def test_rollback_quarantines_newer_bundles_on_the_bucket_and_fences_the_writer(
    cli: InProcess, s3_remote: Any, rgw: Any, tmp_path: Path
) -> None:
    store, _ = open_bucket(s3_remote, lineage=LINEAGE)
    writer = acquire(store, "run-a", LINEAGE)
    for step in (2, 4, 6, 8):
        upload_bundle(store, make_bundle(tmp_path / "a", step, lineage=LINEAGE), writer, hmac_key=None, deadline_s=60)
    foreign = make_bundle(tmp_path / "f", 10, lineage="someone-elses")  # published, but of another lineage
    upload_bundle(store, foreign, writer, hmac_key=None, deadline_s=60)
    loader = store.key(BUNDLES, "step_4.run-a.e1", "train_dataloader.pt")  # step_4: same size, other bytes
    rgw.client().put_object(Bucket=rgw.bucket, Key=loader, Body=b"\1" * (tmp_path / "a" / "step_4" /
                                                                         "train_dataloader.pt").stat().st_size)
    before, _ = read_record(store)

    for to, named in ((4, "step_4 on the bucket does not verify (train_dataloader.pt: its bytes on the server do "
                          "not match the manifest's digest); nothing changed: roll back to another step"),
                      (10, "step_10 on the bucket does not verify (of lineage someone-elses, not this directory's "
                           f"{LINEAGE}); nothing changed: roll back to another step"),
                      (5, "step_5 is not a bundle on the bucket (listed: step_10, step_8, step_6, step_4, step_2); "
                          "roll back to one of those")):  # fmt: skip
        out = cli("ckpt", "rollback", *flags(s3_remote), "--to", str(to))
        assert out.rc == 2 and out.errors() == [f"sc-app: error: {named}"], out.out
    dry = cli("ckpt", "rollback", *flags(s3_remote), "--to", "6", "--dry-run")
    assert dry.rc == 0, dry.out
    assert "step_6; would quarantine step_10 (step_10.run-a.e1), step_8 (step_8.run-a.e1)" in dry.stdout
    assert read_record(store)[0] == before, "a refusal or a dry run changes nothing"

    done = cli("ckpt", "rollback", *flags(s3_remote), "--to", "6")
    assert done.rc == 0, done.out
    assert "quarantined step_10 (step_10.run-a.e1), step_8 (step_8.run-a.e1); the bucket is now held at epoch 2" \
        in done.stdout
    doc = listed(cli, s3_remote)
    assert [b["name"] for b in doc["bundles"]] == ["step_6", "step_4", "step_2"]
    assert [(q["dir"], q["why"]) for q in doc["quarantined"]] == [
        ("step_10.run-a.e1", "rolled back to step_6"), ("step_8.run-a.e1", "rolled back to step_6")]
    assert doc["unpublished"] == [] and doc["holder"]["epoch"] == 2
    assert doc["holder"]["run_id"].startswith("rollback-")
    kept = objects(store, "step_8.run-a.e1")
    assert kept and objects(store, "step_10.run-a.e1"), "quarantined on the bucket: its objects stay"

    # the writer that held the bucket is fenced: nothing newer than step_6 is published after the rollback
    with pytest.raises(RemoteLeaseLost, match="publishes nothing more there"):
        upload_bundle(store, make_bundle(tmp_path / "a", 12, lineage=LINEAGE), writer, hmac_key=None, deadline_s=60)
    # the next attempt takes the bucket and publishes a new step_8; the quarantined upload stays as it was
    nxt = acquire(store, "run-b", LINEAGE)
    assert nxt.epoch == 3
    upload_bundle(store, make_bundle(tmp_path / "b", 8, lineage=LINEAGE), nxt, hmac_key=None, deadline_s=60)
    pruned = cli("ckpt", "prune", *flags(s3_remote), "--keep", "1", "--json")
    assert pruned.rc == 0 and json.loads(pruned.stdout) == {"removed": ["step_6", "step_4", "step_2"]}, pruned.out
    doc = listed(cli, s3_remote)
    assert [(b["name"], b["dir"]) for b in doc["bundles"]] == [("step_8", "step_8.run-b.e3")]
    assert objects(store, "step_8.run-a.e1") == kept, "retention never deletes a quarantined bundle"
    assert len(doc["quarantined"]) == 2


def hf_bundle(root: Path, step: int, policy: Path) -> Path:
    """A committed bundle whose policy is a real hf-backend save (``policy``), model.backend=hf."""
    w = BundleWriter(root, step).begin()
    record = write_contents(w, step, lineage=LINEAGE)
    shutil.rmtree(w.policy_dir)
    shutil.copytree(policy, w.policy_dir)
    record["compat"] = {**record["compat"], "model.backend": "hf"}
    return w.commit(record)


@pytest.fixture(scope="module")
def hf_policy(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    """A real hf policy directory (a tiny random model built here, one train step, the trainer's own writer) and
    its logits on a fixed input."""
    torch = pytest.importorskip("torch")
    from sc_app.rl.hf.trainer import HFTrainer, TrainBatch, TrainerSettings
    from tests.support.hf import make_model_dir

    root = tmp_path_factory.mktemp("hf")
    trainer = HFTrainer(TrainerSettings(str(make_model_dir(root / "model")), learning_rate=5e-2, prompt_len=3), 0, 1,
                        torch.device("cpu"))  # fmt: skip
    tokens = torch.randint(4, 20, (4, 7), generator=torch.Generator().manual_seed(0))
    batch = TrainBatch(tokens, torch.ones_like(tokens), torch.ones(4, 4, dtype=torch.long), torch.full((4, 4), -3.0),
                       torch.randn(4))  # fmt: skip
    trainer.train_step(batch, 1)
    trainer.capture()
    policy = root / "policy"
    policy.mkdir()
    trainer.write_captured(policy)
    with torch.no_grad():
        weights = {k: v.clone() for k, v in trainer.hf_model.state_dict().items()}
    return policy, weights


def test_export_from_the_bucket_passes_over_what_does_not_count(
    cli: InProcess, s3_remote: Any, rgw: Any, tmp_path: Path, hf_policy: Any
) -> None:
    from transformers import AutoModelForCausalLM

    policy, weights = hf_policy
    store, _ = open_bucket(s3_remote, lineage=LINEAGE)
    lease = acquire(store, "run-a", LINEAGE)
    for step in (2, 4, 6):
        upload_bundle(store, hf_bundle(tmp_path / "a", step, policy), lease, hmac_key=None, deadline_s=60)
    upload_bundle(store, make_bundle(tmp_path / "t", 8, lineage="another-lineage"), lease, hmac_key=None,
                  deadline_s=60)  # fmt: skip
    shard = next(k for k, _ in store.list(store.key(BUNDLES, "step_6.run-a.e1", "policy") + "/")
                 if k.endswith(".distcp"))  # fmt: skip
    size = next(s for k, s in store.list(shard) if k == shard)
    rgw.client().put_object(Bucket=rgw.bucket, Key=shard, Body=b"\0" * size)  # step_6: same size, other bytes

    out = cli("export", *flags(s3_remote), "--out", str(tmp_path / "exported"))
    assert out.rc == 0, out.out
    lines = out.stdout.splitlines()
    assert lines[0] == f"skipped step_8: of lineage another-lineage, not this directory's {LINEAGE}"
    assert lines[1].startswith("skipped step_6: ") and "do not match the manifest's digest" in lines[1]
    assert lines[2].startswith(f"exported step_4 (step 4, {s3_remote.url}) to {tmp_path / 'exported'}")
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "exported")
    got = model.state_dict()
    assert set(got) & set(weights) and all(got[k].equal(v) for k, v in weights.items() if k in got)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "exported", "t"], "the download scratch is removed"

    named = cli("export", *flags(s3_remote), "--step", "6", "--out", str(tmp_path / "six"))
    assert named.rc == 2, named.out
    assert named.errors()[0].endswith("its bytes do not match the manifest's digest: that bundle is not used; export "
                                      "another --step")
    absent = cli("export", *flags(s3_remote), "--step", "5", "--out", str(tmp_path / "five"))
    assert absent.errors() == [f"sc-app: error: step_5 is not a bundle on {s3_remote.url} (see `sc-app ckpt list "
                               "--remote`); export another --step"]
    assert not (tmp_path / "six").exists() and not (tmp_path / "five").exists()
    both = cli("export", "--checkpoint-dir", str(tmp_path), *flags(s3_remote), "--out", str(tmp_path / "x"))
    assert both.errors() == ["sc-app: error: give exactly one of --checkpoint-dir DIR and --remote s3://bucket/prefix"]
