"""sc-app: single-controller asynchronous GRPO on Ray with crash-consistent, resumable checkpoints."""

from sc_app import compile_marks

__version__ = "0.1.0"

compile_marks.install()  # every process of a job imports this first: tensordict's import skips torch._dynamo
