"""``sc_app.compile_marks``: importing tensordict in an sc-app process skips ``torch._dynamo`` (seconds of CPU in
every process of a job), and the marks tensordict asked for are applied once Dynamo is loaded, exactly as if they
had been applied at once. Each case runs in a fresh interpreter: this one has torch and tensordict loaded already."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from sc_app import compile_marks
from tests.support.proc import REPO

HEAVY = ("torch", "tensordict", "ray", "transfer_queue")


def run_fresh(code: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_tensordict_loads_without_dynamo_and_its_marks_apply_when_dynamo_loads() -> None:
    got = run_fresh(
        f"""
        import json, sys
        import sc_app
        heavy_after_sc_app = sorted(m for m in sys.modules if m.split(".")[0] in {HEAVY!r})
        import tensordict, torch
        from sc_app import compile_marks
        td = tensordict.TensorDict({{"a": torch.arange(3)}}, batch_size=[3])
        r = {{
            "heavy_after_sc_app": heavy_after_sc_app,
            "dynamo_after_tensordict": "torch._dynamo" in sys.modules,
            "pending": len(compile_marks.pending()),
            "marks_put_back": [getattr(torch.compiler, m).__module__ for m in compile_marks.MARKS],
            "loader_kept": type(tensordict.__loader__).__name__,
            "eager": td["a"].tolist(),
        }}
        import torch._dynamo
        from torch._dynamo import trace_rules
        import tensordict.base, tensordict.utils
        r["pending_after_dynamo"] = len(compile_marks.pending())
        r["allowed"] = id(tensordict.base._foreach_copy_compiled) in trace_rules._allowed_callable_ids
        r["constant"] = getattr(tensordict.utils._lock_warn, "_dynamo_marked_constant", False)
        print(json.dumps(r))
        """
    )
    assert got["heavy_after_sc_app"] == [], "import sc_app must stay light: the hook imports nothing itself"
    assert got["dynamo_after_tensordict"] is False
    assert got["pending"] > 0
    assert got["marks_put_back"] == ["torch.compiler", "torch.compiler"], "the swap lasts only tensordict's import"
    assert got["loader_kept"] != "_Chained"
    assert got["eager"] == [0, 1, 2]
    assert got["pending_after_dynamo"] == 0
    assert got["allowed"] is True and got["constant"] is True, "a deferred mark was never applied"


def test_with_dynamo_loaded_first_nothing_is_deferred() -> None:
    got = run_fresh(
        """
        import json
        import torch._dynamo
        import sc_app, tensordict.base
        from sc_app import compile_marks
        from torch._dynamo import trace_rules
        allowed = id(tensordict.base._foreach_copy_compiled) in trace_rules._allowed_callable_ids
        print(json.dumps({"pending": len(compile_marks.pending()), "allowed": allowed}))
        """
    )
    assert got == {"pending": 0, "allowed": True}


def test_install_puts_one_hook_first() -> None:
    compile_marks.install()
    compile_marks.install()
    hooks = [f for f in sys.meta_path if isinstance(f, compile_marks.DeferCompileMarks)]
    assert len(hooks) == 1
