"""Typed configuration: an embedded default, a YAML file, then ``--set a.b=c`` overrides, validated at the edge.

Pure: imports neither Ray nor torch. Every error names the key it is about (``ConfigError``), and a config that
cannot run — a storage-unit count that cannot be scheduled on the cluster's CPUs, a sequence longer than the
model's context — is refused before anything starts.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from sc_app.config.embedded import check_embedded_cpus
from sc_app.config.engine import OLD_LOGPROBS_HELP, EngineSettings, check_engine
from sc_app.config.input import MAX_SECONDS, check_section
from sc_app.config.remote import RemoteConfig, check_volume
from sc_app.config.tree import (
    ConfigError,
    Override,
    leaf_sources,
    origin_of,
    parse_override,
    read_file,
    rename_keys,
    set_path,
    short_text,
)

__all__ = ["AppConfig", "ConfigError", "Override", "dump_config", "load_config", "read_file"]

REWARD_PATTERN = r"exact_match|numeric_match|[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*"


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    @model_validator(mode="after")
    def _bounded(self) -> _Section:
        check_section(type(self).__name__, self.__dict__)
        return self


class RunConfig(_Section):
    max_steps: int = Field(150, ge=1, description="Train steps to reach; the job exits 0 there.")
    seed: int = Field(0, description="Seeds the prompt stream, model init and sampling.")
    trace_file: str | None = Field(None, description="Optional JSONL trace of issued prompts and trained steps.")
    max_in_job_restores: int = Field(
        3,
        ge=0,
        description="A dead trainer rank, TransferQueue storage unit or controller, controller actor or node is "
        "restored in-job (same Ray cluster, from the newest bundle) at most this many times per attempt; past it, or "
        "when the cluster no longer fits the job, the attempt ends (exit 1) for a retry (docs/recovery.md). 0: off.",
    )
    hang_timeout_s: float = Field(
        300.0,
        gt=0,
        le=MAX_SECONDS,
        description="The controller actor not answering, or the job reporting no step, save or fault, for this long "
        "(a SIGSTOPped, deadlocked or frozen process) is treated like a dead process: in-job restore per "
        "run.max_in_job_restores, else the attempt ends (exit 1). Keep above the slowest step.",
    )
    setup_timeout_s: float = Field(
        1800.0,
        gt=0,
        le=MAX_SECONDS,
        description="Set-up (workers start, model load, restore, first weight sync) must finish within this; past it "
        "the process it waits on is treated as hung (like a dead one). A stop request ends the set-up at once.",
    )
    in_job_restore: Literal["warm", "full"] = Field(
        "warm",
        description="How an in-job restore rolls the job back: warm (only the dead actors and the data plane start "
        "again; live trainer ranks, generation engines and the controller actor are reset in place, falling back to "
        "full when a reset fails) or full (the whole job torn down and set up again, as a start).",
    )
    reset_timeout_s: float = Field(
        300.0,
        gt=0,
        le=MAX_SECONDS,
        description="A warm in-job restore's bound on each wait (a live actor's reset, the bundle's load, the weight "
        "sync); past it the full rebuild runs.",
    )
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    log_dir: str | None = Field(
        None,
        description="Run log: metrics.jsonl (one line per step and per event, appended by every attempt) and "
        "TensorBoard event files. Default <checkpoint.dir>/logs: on the checkpoint volume, so it survives retries.",
    )
    log_enabled: bool = Field(True, description="Write the run log; off: only the printed progress lines.")
    log_buffer: int = Field(
        10_000,
        ge=1,
        description="Run-log records held while the log volume is slower than training; past that, new steps are "
        "dropped, counted, and the count logged (training never waits for the log).",
    )
    tensorboard: bool = Field(True, description="Write TensorBoard event files beside metrics.jsonl.")
    metrics_enabled: bool = Field(
        True, description="Record Prometheus metrics through Ray's metrics pipeline (ray.util.metrics)."
    )


class RayConfig(_Section):
    address: str | None = Field(
        None, description="None: start a local Ray in-process (embedded). 'auto' or host:port: join a cluster."
    )
    num_cpus: int = Field(8, ge=1, description="Logical CPUs of the embedded local Ray (not physical cores).")
    namespace: str = "sc_app"
    metrics_export_port: int | None = Field(
        None,
        ge=1,
        le=65535,
        description="Embedded Ray only: serve Prometheus metrics on this port (None: a free port Ray picks). "
        "On a cluster the port is `ray start --metrics-export-port` (8080 in the chart).",
    )


class DataPlaneConfig(_Section):
    storage_units: int = Field(1, ge=1, description="TransferQueue SimpleStorage units (1 CPU each).")
    partition: str = Field("train", min_length=1)
    storage_node_resource: str | None = Field(
        None, description="Custom Ray resource a node must have to host a storage unit."
    )
    groups_per_put: int = Field(
        0,
        ge=0,
        description="Most groups one rollout commit puts in one TransferQueue call (0: every group of a generate "
        "call). Fewer calls are faster; a stored row keeps its whole put's buffer alive until every row of it is "
        "cleared, so a cap bounds how much memory one slow group can hold.",
    )
    retries: int = Field(
        3,
        ge=0,
        description="Retries of a failed data-plane call (put, advantage write, clear, read) before the run stops; "
        "a put that still fails has its rows removed first (docs/recovery.md).",
    )
    retry_backoff_s: float = Field(
        0.05, ge=0, description="Wait before the first retry; doubled for each next one, at most 2 s."
    )
    snapshot: Literal["streamed", "native"] = Field(
        "streamed",
        description="streamed: capture rows in the barrier window, write them after it (no pickle); "
        "native: TransferQueue's own save, all bytes inside the window. Restore reads both.",
    )


class ModelConfig(_Section):
    backend: Literal["tiny", "hf"] = Field(
        "tiny",
        description="tiny: the built-in tiny LM (the keys below); hf: a local Hugging Face causal LM at model.path.",
    )
    path: str | None = Field(
        None, description="hf: a local Hugging Face model directory (config, tokenizer, safetensors); never downloaded."
    )
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto",
        description="hf: compute dtype (auto: float32 on CPU, bfloat16 on GPU); trainer weights and Adam stay float32.",
    )
    vocab_size: int = Field(10, ge=4, description="tiny only.")
    d_model: int = Field(64, ge=8, description="tiny only.")
    n_layers: int = Field(2, ge=1, description="tiny only.")
    n_heads: int = Field(4, ge=1, description="tiny only.")
    max_seq_len: int = Field(16, ge=2, description="tiny only.")

    @model_validator(mode="after")
    def _heads_divide(self) -> ModelConfig:
        if self.d_model % self.n_heads:
            raise ValueError(f"model.d_model ({self.d_model}) must be divisible by model.n_heads ({self.n_heads})")
        return self


class TaskConfig(_Section):
    name: Literal["repeat_first", "jsonl"] = Field(
        "repeat_first",
        description="repeat_first: answer with the prompt's first token, reward = fraction right; "
        "jsonl (hf backend): your prompts and answers in task.path, scored by task.reward.",
    )
    prompt_len: int = Field(
        4, ge=1, description="Prompt tokens (jsonl: the longest prompt after the chat template; shorter are padded)."
    )
    response_len: int = Field(4, ge=1, description="Response tokens generated (hf: at most; generation stops at eos).")
    dataset_size: int = Field(
        1_000_000, ge=1, description="repeat_first: prompts per epoch; the loader wraps to a new epoch."
    )
    path: str | None = Field(None, description="jsonl: one JSON object per line with 'prompt' and 'answer'.")
    reward: str = Field(
        "exact_match",
        description="jsonl: exact_match | numeric_match | package.module:function (called with keywords prompt, "
        "completion, answer; returns a number).",
    )
    shuffle: bool = Field(True, description="jsonl: a new order of the rows every epoch (keyed by run.seed).")
    allow_changed_dataset: bool = Field(
        False,
        description="jsonl: resume even though task.path's content differs from the file the bundle was cut with "
        "(the loader place then points into the new file).",
    )

    @field_validator("reward")
    @classmethod
    def _reward_spec(cls, value: str) -> str:
        if not re.fullmatch(REWARD_PATTERN, value):
            raise ValueError(f"task.reward {value!r}: expected exact_match, numeric_match or package.module:function")
        return value


class GRPOConfig(_Section):
    prompts_per_step: int = Field(8, ge=1, description="Groups consumed by one train step.")
    group_size: int = Field(
        8,
        ge=2,
        description="Rows per group, one per generation of the prompt (GRPO needs >= 2). Formerly "
        "grpo.num_generations_per_prompt, still read with a warning.",
    )
    learning_rate: float = Field(3e-3, gt=0)
    max_staleness: int = Field(1, ge=0, description="Train on groups generated at most this many versions ago.")
    max_groups_buffered: int = Field(16, ge=1, description="Backpressure: committed + in-flight groups held at most.")
    temperature: float = Field(1.0, gt=0)
    max_grad_norm: float | None = Field(None, gt=0, description="hf: clip the gradient norm (None: no clipping).")
    old_logprobs: Literal["trainer", "engine"] = Field("trainer", description=OLD_LOGPROBS_HELP)


class WorkerGroupConfig(_Section):
    num_workers: int = Field(1, ge=1)
    num_cpus: float = Field(1.0, ge=0)
    num_gpus: float = Field(0.0, ge=0)
    resources: dict[str, float] = Field(default_factory=dict, description="Custom Ray resources per worker.")


class TrainerConfig(WorkerGroupConfig):
    strategy: Literal["ddp", "fsdp"] = Field(
        "ddp",
        description="hf: ddp (every worker holds the model, gradients averaged) or fsdp (FSDP2: parameters, "
        "gradients and optimizer state sharded across the workers). A bundle resumes under either, any count.",
    )
    micro_batch_rows: int = Field(0, ge=0, description="hf: rows per forward/backward (0: the worker's whole share).")
    spare_ranks: int = Field(
        0,
        ge=0,
        le=8,
        description="Spare trainer ranks, each holding a trainer rank's resources (its GPU too): started and warmed "
        "up while the job trains, one takes a dead rank's place in a warm in-job restore instead of a new process "
        "(docs/recovery.md). 0: a new rank is started.",
    )


class GenerationWorkersConfig(WorkerGroupConfig, EngineSettings):
    max_restarts: int = Field(
        3,
        ge=0,
        description="Dead generation workers replaced in-job, per worker within restart_window_s; past it the run "
        "stops with one line (docs/recovery.md). 0: a dead worker ends the run.",
    )
    restart_window_s: float = Field(600.0, gt=0, description="The window generation.max_restarts counts in.")
    top_k: int = Field(0, ge=0, description="hf: sample from the k likeliest tokens (0: off).")
    top_p: float = Field(1.0, gt=0, le=1, description="hf: nucleus sampling (1.0: off).")


class CheckpointConfig(_Section):
    dir: str = Field("checkpoints", min_length=1, description="Where step_N/ bundles live (the PVC on Kubernetes).")
    save_period: int = Field(10, ge=1, description="Save a bundle every this many train steps.")
    keep: int = Field(3, ge=1, description="Complete bundles kept; older ones are pruned after a verified save.")
    enabled: bool = True
    on_corrupt: Literal["fallback", "strict"] = Field(
        "fallback", description="fallback: resume from the newest verified bundle; strict: stop."
    )
    on_save_error: Literal["continue", "stop"] = Field(
        "continue", description="A failed save (e.g. full disk): keep training and retry next period, or stop."
    )
    emergency_budget_s: float = Field(
        60.0,
        gt=0,
        le=MAX_SECONDS,
        description="On SIGTERM or `sc-app stop`: seconds to finish the step and cut a bundle; keep below the grace "
        "period.",
    )
    preemption_notice_s: float | None = Field(
        None,
        gt=0,
        description="Seconds of notice your platform gives before a preemption kills a pod (ops/README.md table); a "
        "save slower than this is warned about: save_period, not the emergency bundle, is then the protection.",
    )
    lease_ttl_s: float = Field(
        60.0,
        ge=3,
        le=MAX_SECONDS,
        description="The writer lease expires this long after its holder's last heartbeat (renewed every third of "
        "it); until then no other command tidies the directory.",
    )
    volume: Literal["shared", "local"] = Field(
        "shared",
        description="shared: every process sees checkpoint.dir (one volume); local: each node has its own disk there "
        "and checkpoint.remote.url outlives it (docs/object-storage.md 'Without a shared volume').",
    )
    remote: RemoteConfig = Field(default_factory=RemoteConfig)


class AppConfig(_Section):
    run: RunConfig = Field(default_factory=RunConfig)
    ray: RayConfig = Field(default_factory=RayConfig)
    data_plane: DataPlaneConfig = Field(default_factory=DataPlaneConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    task: TaskConfig = Field(default_factory=TaskConfig)
    grpo: GRPOConfig = Field(default_factory=GRPOConfig)
    trainer: TrainerConfig = Field(default_factory=TrainerConfig)
    generation: GenerationWorkersConfig = Field(default_factory=GenerationWorkersConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)

    @model_validator(mode="after")
    def _fits(self) -> AppConfig:
        seq = self.task.prompt_len + self.task.response_len
        if self.model.backend == "tiny" and seq > self.model.max_seq_len:
            raise ValueError(
                f"task.prompt_len + task.response_len = {seq} exceeds model.max_seq_len = {self.model.max_seq_len}"
            )
        if self.model.backend == "hf" and not self.model.path:
            raise ValueError("model.backend=hf needs model.path: a local Hugging Face model directory")
        if self.task.name == "jsonl":
            if self.model.backend != "hf":
                raise ValueError("task.name=jsonl needs model.backend=hf (the tiny model has no tokenizer)")
            if not self.task.path:
                raise ValueError("task.name=jsonl needs task.path: a JSONL file of {'prompt', 'answer'} lines")
        check_engine(self)
        if self.checkpoint.remote.enabled and not self.checkpoint.enabled:
            raise ValueError("checkpoint.remote.url needs checkpoint.enabled=true: bundles are written locally first")
        check_volume(self.checkpoint.volume, self.checkpoint.remote, self.data_plane.snapshot)
        rows = self.grpo.prompts_per_step * self.grpo.group_size
        if rows < self.trainer.num_workers:
            raise ValueError(
                f"a step trains {rows} rows (grpo.prompts_per_step x grpo.group_size) but "
                f"trainer.num_workers={self.trainer.num_workers}: every trainer needs at least one row"
            )
        if self.ray.address is not None and self.ray.metrics_export_port is not None:
            raise ValueError(
                f"ray.metrics_export_port applies to the embedded Ray only, but ray.address={self.ray.address!r}: "
                "a cluster's port is set by `ray start --metrics-export-port` (the chart's rayPorts.metrics); "
                "unset ray.metrics_export_port"
            )
        if self.ray.address is None:
            check_embedded_cpus(self)
        return self


def _error_line(err: ValidationError, sources: dict[str, str]) -> str:
    """One line for the first validation error, naming the key and where its value came from."""
    first = err.errors()[0]
    loc = ".".join(str(p) for p in first["loc"])
    msg = first["msg"]
    origin = origin_of(loc, sources)
    if first["type"] == "extra_forbidden":
        line = f"unknown config key '{loc}': check its spelling against `sc-app config` output"
    elif first["type"] == "value_error":
        return msg.removeprefix("Value error, ")
    elif loc:
        line = f"'{loc}': {msg} (got {short_text(repr(first.get('input')))})"
    else:
        line = msg
    return f"{origin}: {line}" if origin else line


def load_config(path: str | Path | None = None, overrides: Sequence[str | Override] = ()) -> AppConfig:
    """Embedded default ← YAML file ← overrides, validated once at the end; an error names the key and whether it
    came from the file or from which flag."""
    tree: dict[str, Any] = {}
    sources: dict[str, str] = {}
    if path is not None:
        tree = read_file(Path(path))
        leaf_sources(tree, "", f"config file {path}", sources)
    for item in overrides:
        override = item if isinstance(item, Override) else Override(item)
        key, value = parse_override(override.text, source=override.source)
        set_path(tree, key, value, source=override.source)
        sources[key] = override.source
        leaf_sources(value, key, override.source, sources)
    rename_keys(tree, sources)
    try:
        return AppConfig.model_validate(tree)
    except ValidationError as err:
        raise ConfigError(_error_line(err, sources)) from None


def dump_config(cfg: AppConfig) -> str:
    """YAML of the full resolved config (what the run actually uses)."""
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)
