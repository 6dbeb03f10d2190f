"""Config: embedded default ← YAML file ← ``--set`` overrides, refused at the edge with the key named."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from sc_app.config.app import AppConfig, ConfigError, dump_config, load_config, parse_override
from sc_app.config.embedded import cpus_required


def refused(*overrides: str, path: Path | None = None) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(path, list(overrides))
    msg = str(info.value)
    assert "\n" not in msg, f"error is not one line: {msg!r}"
    return msg


# ------------------------------------------------------------------------------------------------ defaults
def test_embedded_default_needs_no_file() -> None:
    cfg = load_config()
    assert isinstance(cfg, AppConfig)
    # the keys tools and scripts rely on (README "Configuration")
    assert cfg.checkpoint.dir == "checkpoints"
    assert cfg.checkpoint.save_period == 10
    assert cfg.checkpoint.keep == 3
    assert cfg.run.max_steps == 150
    assert cfg.ray.address is None, "the default must be embedded (local Ray)"
    assert cfg.checkpoint.on_corrupt == "fallback"
    # the default must be schedulable on its own embedded Ray (TransferQueue hangs silently otherwise)
    assert cpus_required(cfg) <= cfg.ray.num_cpus
    assert cfg.task.prompt_len + cfg.task.response_len <= cfg.model.max_seq_len
    assert cfg.model.d_model % cfg.model.n_heads == 0


def test_dump_round_trips() -> None:
    cfg = load_config(None, ["checkpoint.save_period=3", "trainer.resources={trainer_node: 1}"])
    again = AppConfig.model_validate(yaml.safe_load(dump_config(cfg)))
    assert again == cfg


# ------------------------------------------------------------------------------------------------ file + overrides
def test_yaml_file_is_applied_and_overrides_win(tmp_path: Path) -> None:
    f = tmp_path / "job.yaml"
    f.write_text(
        "run:\n  max_steps: 40\n  seed: 7\n"
        "checkpoint:\n  dir: /mnt/ckpt\n  save_period: 5\n"
        "data_plane:\n  storage_units: 2\n"
        "generation:\n  resources: {gen_node: 1}\n"
    )
    cfg = load_config(f)
    assert (cfg.run.max_steps, cfg.run.seed) == (40, 7)
    assert (cfg.checkpoint.dir, cfg.checkpoint.save_period) == ("/mnt/ckpt", 5)
    assert cfg.data_plane.storage_units == 2
    assert cfg.generation.resources == {"gen_node": 1.0}
    assert cfg.checkpoint.keep == 3, "keys absent from the file keep their defaults"
    cfg = load_config(f, ["checkpoint.save_period=2", "run.seed=1"])
    assert cfg.checkpoint.save_period == 2 and cfg.run.seed == 1
    assert cfg.run.max_steps == 40 and cfg.checkpoint.dir == "/mnt/ckpt"


def test_empty_yaml_file_is_the_default(tmp_path: Path) -> None:
    f = tmp_path / "empty.yaml"
    f.write_text("# nothing here\n")
    assert load_config(f) == load_config()


@pytest.mark.parametrize(
    ("override", "get", "want"),
    [
        ("checkpoint.save_period=2", lambda c: c.checkpoint.save_period, 2),
        ("checkpoint.enabled=false", lambda c: c.checkpoint.enabled, False),
        ("grpo.learning_rate=0.01", lambda c: c.grpo.learning_rate, 0.01),
        ("grpo.learning_rate=1e-3", lambda c: c.grpo.learning_rate, 1e-3),
        ("run.trace_file=/tmp/t.jsonl", lambda c: c.run.trace_file, "/tmp/t.jsonl"),
        ("ray.address=127.0.0.1:6379", lambda c: c.ray.address, "127.0.0.1:6379"),
        ("ray.address=null", lambda c: c.ray.address, None),
        ("trainer.resources={trainer_node: 1}", lambda c: c.trainer.resources, {"trainer_node": 1.0}),
        ("data_plane.storage_node_resource=tq_node", lambda c: c.data_plane.storage_node_resource, "tq_node"),
        ("checkpoint.on_corrupt=strict", lambda c: c.checkpoint.on_corrupt, "strict"),
        ("data_plane.groups_per_put=1", lambda c: c.data_plane.groups_per_put, 1),
        ("data_plane.retries=0", lambda c: c.data_plane.retries, 0),
        ("data_plane.retry_backoff_s=0.5", lambda c: c.data_plane.retry_backoff_s, 0.5),
    ],
)
def test_set_values_are_yaml_typed(override: str, get: object, want: object) -> None:
    cfg = load_config(None, [override])
    got = get(cfg)  # type: ignore[operator]
    assert got == want and type(got) is type(want), (override, got)


def test_parse_override_splits_on_first_equals() -> None:
    assert parse_override("run.trace_file=/a=b") == ("run.trace_file", "/a=b")
    assert parse_override("a.b=") == ("a.b", "")


# ------------------------------------------------------------------------------------------------ refusals
@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("nope=1", "'nope'"),
        ("checkpoint.sav_period=2", "'checkpoint.sav_period'"),
        ("trainer.num_worker=2", "'trainer.num_worker'"),
    ],
)
def test_unknown_key_is_named(override: str, key: str) -> None:
    msg = refused(override)
    assert "unknown config key" in msg and key in msg, msg


def test_unknown_key_in_file_is_named(tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("checkpoint:\n  save_every: 3\n")
    msg = refused(path=f)
    assert "'checkpoint.save_every'" in msg


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("checkpoint.save_period=abc", "checkpoint.save_period"),
        ("checkpoint.save_period=0", "checkpoint.save_period"),
        ("data_plane.groups_per_put=-1", "data_plane.groups_per_put"),
        ("data_plane.retries=-1", "data_plane.retries"),
        ("data_plane.retry_backoff_s=-0.1", "data_plane.retry_backoff_s"),
        ("run.max_steps=-3", "run.max_steps"),
        ("checkpoint.enabled=maybe", "checkpoint.enabled"),
        ("checkpoint.on_corrupt=sometimes", "checkpoint.on_corrupt"),
        ("trainer.resources=gpu", "trainer.resources"),
        ("grpo.group_size=1", "grpo.group_size"),
        ("run.max_steps.x=1", "run.max_steps"),
        ("checkpoint=3", "checkpoint"),
        ("run.log_buffer=0", "run.log_buffer"),
        ("run.log_enabled=sometimes", "run.log_enabled"),
        ("ray.metrics_export_port=70000", "ray.metrics_export_port"),
    ],
)
def test_wrong_type_or_range_is_named(override: str, key: str) -> None:
    msg = refused(override)
    assert f"'{key}'" in msg, msg


def test_section_replaced_by_value_then_set_inside_is_named() -> None:
    msg = refused("checkpoint=3", "checkpoint.keep=2")
    assert "checkpoint" in msg and "not a section" in msg


def test_storage_units_that_cannot_be_scheduled() -> None:
    msg = refused("data_plane.storage_units=20")
    assert "data_plane.storage_units" in msg and "ray.num_cpus" in msg, msg
    # the same combination is fine once the embedded Ray is big enough
    cfg = load_config(None, ["data_plane.storage_units=20", "ray.num_cpus=32"])
    assert cpus_required(cfg) <= 32
    # workers count too: they compete for the same logical CPUs
    msg = refused("trainer.num_workers=4", "generation.num_workers=3")
    assert "ray.num_cpus" in msg
    # and spare trainer ranks, each a trainer rank's CPUs: 8 of them do not fit the default 8
    msg = refused("trainer.spare_ranks=8")
    assert "trainer.spare_ranks=8: 8" in msg and "ray.num_cpus=8" in msg, msg
    assert cpus_required(load_config(None, ["trainer.spare_ranks=1"])) == cpus_required(load_config()) + 1


def test_metrics_export_port_is_for_the_embedded_ray_only() -> None:
    assert load_config(None, ["ray.metrics_export_port=9100"]).ray.metrics_export_port == 9100
    msg = refused("ray.address=auto", "ray.metrics_export_port=9100")
    assert "ray.metrics_export_port" in msg and "--metrics-export-port" in msg, msg


def test_a_volume_of_each_nodes_own_needs_a_bucket_and_streamed_snapshots() -> None:
    assert load_config(None, []).checkpoint.volume == "shared"
    msg = refused("checkpoint.volume=local")
    assert "checkpoint.volume=local needs checkpoint.remote.url" in msg, msg
    bucket = "checkpoint.remote.url=s3://my-bucket/jobs/x"
    msg = refused("checkpoint.volume=local", bucket, "data_plane.snapshot=native")
    assert "needs data_plane.snapshot=streamed" in msg, msg
    assert load_config(None, ["checkpoint.volume=local", bucket]).checkpoint.volume == "local"
    assert "checkpoint.volume" in refused("checkpoint.volume=nfs")


def test_ranks_uploading_their_own_parts_is_for_a_volume_of_each_nodes_own() -> None:
    bucket = "checkpoint.remote.url=s3://my-bucket/jobs/x"
    assert load_config(None, [bucket]).checkpoint.remote.parts == "via_head"
    msg = refused(bucket, "checkpoint.remote.parts=direct")
    assert "checkpoint.remote.parts=direct is for checkpoint.volume=local" in msg, msg
    cfg = load_config(None, [bucket, "checkpoint.volume=local", "checkpoint.remote.parts=direct"])
    assert cfg.checkpoint.remote.parts == "direct"
    assert "checkpoint.remote.parts" in refused(bucket, "checkpoint.volume=local", "checkpoint.remote.parts=rank")


def test_sequence_longer_than_model_context() -> None:
    msg = refused("task.prompt_len=12", "task.response_len=8")
    assert "task.prompt_len" in msg and "model.max_seq_len" in msg, msg
    assert load_config(None, ["task.prompt_len=12", "task.response_len=8", "model.max_seq_len=20"])


def test_heads_must_divide_model_width() -> None:
    msg = refused("model.n_heads=5")
    assert "model.n_heads" in msg and "model.d_model" in msg, msg


def test_malformed_yaml_file(tmp_path: Path) -> None:
    f = tmp_path / "bad.yaml"
    f.write_text("run:\n  max_steps: 3\n checkpoint: [\n")
    msg = refused(path=f)
    assert str(f) in msg and "malformed YAML" in msg and "line" in msg, msg


def test_malformed_yaml_in_set_names_the_key() -> None:
    msg = refused("trainer.resources={trainer_node: 1")
    assert "trainer.resources" in msg and "not valid YAML" in msg, msg


@pytest.mark.parametrize("bad", ["checkpoint.save_period", "=3", ".save_period=3", "checkpoint..keep=3"])
def test_malformed_set_syntax(bad: str) -> None:
    msg = refused(bad)
    assert "--set" in msg, msg


def test_file_problems(tmp_path: Path) -> None:
    msg = refused(path=tmp_path / "absent.yaml")
    assert "absent.yaml" in msg and "missing" in msg
    f = tmp_path / "list.yaml"
    f.write_text("- a\n- b\n")
    msg = refused(path=f)
    assert "top level must be a mapping" in msg


def test_error_from_a_file_names_the_file_and_key(tmp_path: Path) -> None:
    f = tmp_path / "job.yaml"
    f.write_text("checkpoint:\n  save_period: soon\n")
    msg = refused(path=f)
    assert msg.startswith(f"config file {f}:") and "'checkpoint.save_period'" in msg and "--set" not in msg, msg


def test_error_from_a_flag_names_the_flag_not_a_set(tmp_path: Path) -> None:
    from sc_app.config.app import Override

    f = tmp_path / "job.yaml"
    f.write_text("checkpoint: 5\n")
    with pytest.raises(ConfigError) as info:
        load_config(f, [Override(f"checkpoint.dir={tmp_path}", flag=f"--checkpoint-dir {tmp_path}")])
    assert str(info.value).startswith(f"--checkpoint-dir {tmp_path}:") and "--set" not in str(info.value)
    with pytest.raises(ConfigError) as info:
        load_config(None, [Override("run.max_steps=many", flag="--max-steps many")])
    assert str(info.value).startswith("--max-steps many:") and "'run.max_steps'" in str(info.value)


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (b"run:\n  max_steps: 3\n  seed: \xff\xfe\n", "not UTF-8"),
        (b"[" * 10000, "nested too deeply"),
    ],
)
def test_unreadable_file_content_is_one_line(tmp_path: Path, content: bytes, needle: str) -> None:
    f = tmp_path / "odd.yaml"
    f.write_bytes(content)
    msg = refused(path=f)
    assert str(f) in msg and needle in msg, msg


def test_a_directory_as_config_file_is_one_line(tmp_path: Path) -> None:
    msg = refused(path=tmp_path)
    assert "is a directory" in msg, msg


def test_the_old_name_of_a_renamed_key_is_read_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("WARNING", logger="sc_app.config.app"):
        cfg = load_config(None, ["grpo.num_generations_per_prompt=4"])
    assert cfg.grpo.group_size == 4
    assert "'grpo.num_generations_per_prompt' is deprecated; it is now 'grpo.group_size'" in caplog.text
    msg = refused("grpo.num_generations_per_prompt=4", "grpo.group_size=4")
    assert "keep only 'grpo.group_size'" in msg
    assert "grpo.group_size" in refused("grpo.num_generations_per_prompt=1")
    assert "group_size: 4" in dump_config(cfg) and "num_generations_per_prompt" not in dump_config(cfg)
