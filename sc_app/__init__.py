"""sc-app: single-controller asynchronous GRPO on Ray with crash-consistent, resumable checkpoints."""

__version__ = "0.1.0"
