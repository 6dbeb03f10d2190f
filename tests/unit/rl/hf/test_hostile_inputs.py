"""Issue 22, classes A, C and D on the hf backend's inputs: the user's model directory, JSONL task, chat template
and reward, each sibling a case of one parametrized test. Real files, a real tiny model and tokenizer built by
the test (``tests/support/hf.py``), real ``transformers``; the checks are the ones ``sc-app run`` makes before Ray
starts (``sc_app.rl.hf.inputs``). Every refusal is one line naming the problem; none takes more than seconds.
"""

from __future__ import annotations

import json
import shutil
import struct
import sys
import time
from pathlib import Path

import pytest

from sc_app.rl.hf import chat
from sc_app.rl.hf.dataset import DatasetError, load_jsonl
from sc_app.rl.hf.errors import RewardFailed
from sc_app.rl.hf.model_dir import SAFETENSORS_FILE, SAFETENSORS_INDEX, ModelDirError, check_model_dir, load_model
from sc_app.rl.hf.reward_probe import probe_reward
from sc_app.rl.hf.rewards import RewardError, resolve_reward
from sc_app.rl.hf.tasks import JsonlTask
from sc_app.rl.hf.weights_check import check_weights
from tests.support.hf import make_model_dir, write_jsonl


@pytest.fixture(scope="module")
def model_src(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_model_dir(tmp_path_factory.mktemp("hostile") / "model")


@pytest.fixture
def model(model_src: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(model_src, tmp_path / "model"))


def one_line(exc: BaseException, *named: str) -> str:
    text = str(exc)
    assert "\n" not in text and all(n in text for n in named), text
    return text


# ---------------------------------------------------------------------------------------------- safetensors headers
def header_and_data(path: Path) -> tuple[dict, bytes]:
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8 : 8 + n]), raw[8 + n :]


def write_safetensors(path: Path, header: dict, data: bytes, claimed: int | None = None) -> None:
    body = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(body) if claimed is None else claimed) + body + data)


def drop(header: dict, data: bytes, *names: str) -> tuple[dict, bytes]:
    """The header and data without ``names`` (offsets of the rest recomputed: a well-formed file)."""
    out, chunks, at = {}, [], 0
    for key, info in sorted(
        ((k, v) for k, v in header.items() if k != "__metadata__"), key=lambda kv: kv[1]["data_offsets"]
    ):
        if key in names:
            continue
        b, e = info["data_offsets"]
        chunks.append(data[b:e])
        out[key] = {**info, "data_offsets": [at, at + e - b]}
        at += e - b
    return out, b"".join(chunks)


def _no_tensors(h: dict, d: bytes) -> tuple[dict, bytes, int | None]:
    return {"__metadata__": {"format": "pt"}}, b"", None


def _missing_one(h: dict, d: bytes) -> tuple[dict, bytes, int | None]:
    return (*drop(h, d, "model.layers.1.mlp.up_proj.weight"), None)


def _unexpected(h: dict, d: bytes) -> tuple[dict, bytes, int | None]:
    h2, d2 = drop(h, d)
    h2["model.extra.weight"] = {"dtype": "F32", "shape": [1], "data_offsets": [len(d2), len(d2) + 4]}
    return h2, d2 + b"\0" * 4, None


def _wrong_shape(h: dict, d: bytes) -> tuple[dict, bytes, int | None]:
    h2, d2 = drop(h, d)
    info = h2["model.norm.weight"]
    info["shape"] = [info["shape"][0] // 2, 2]
    return h2, d2, None


def _claims_too_much(h: dict, d: bytes) -> tuple[dict, bytes, int | None]:
    return h, d, 1 << 40


def _offsets_outside(h: dict, d: bytes) -> tuple[dict, bytes, int | None]:
    h2, d2 = drop(h, d)
    key = sorted(h2)[0]
    b, e = h2[key]["data_offsets"]
    h2[key]["data_offsets"] = [b + 4, e + 4]
    return h2, d2, None


def _truncated(h: dict, d: bytes) -> tuple[dict, bytes, int | None]:
    return h, d[:-100], None


def _not_json(h: dict, d: bytes) -> tuple[dict, bytes, int | None]:
    return "[" * 5000, b"", None  # type: ignore[return-value]


HEADER_CASES = {
    "no tensors (random init)": (_no_tensors, "missing"),
    "one tensor missing": (_missing_one, "missing model.layers.1.mlp.up_proj.weight"),
    "an unexpected tensor": (_unexpected, "unexpected model.extra.weight"),
    "a wrong shape": (_wrong_shape, "wrong shape model.norm.weight"),
    "header length past the file": (_claims_too_much, "header claims"),
    "offsets leave a gap": (_offsets_outside, "starts at byte"),
    "truncated data": (_truncated, "data bytes"),
    "header nested 5000 deep": (_not_json, "not valid JSON"),
}


@pytest.mark.parametrize("case", sorted(HEADER_CASES))
def test_weights_that_do_not_fit_are_refused_before_ray(model: Path, case: str) -> None:
    make, named = HEADER_CASES[case]
    header, data = header_and_data(model / SAFETENSORS_FILE)
    h2, d2, claimed = make(header, data)
    if isinstance(h2, str):
        body = h2.encode()
        (model / SAFETENSORS_FILE).write_bytes(struct.pack("<Q", len(body)) + body)
    else:
        write_safetensors(model / SAFETENSORS_FILE, h2, d2, claimed)
    with pytest.raises(ModelDirError) as info:
        check_weights(check_model_dir(model))
    one_line(info.value, named, str(model))


def test_the_untouched_model_passes_and_the_loader_agrees(model: Path) -> None:
    md = check_model_dir(model)
    check_weights(md)
    assert load_model(md, None) is not None  # output_loading_info: nothing missing or unexpected


def test_the_loader_itself_refuses_missing_weights(model: Path) -> None:
    header, data = header_and_data(model / SAFETENSORS_FILE)
    write_safetensors(model / SAFETENSORS_FILE, *drop(header, data, "model.norm.weight"))
    with pytest.raises(ModelDirError) as info:  # a worker never trains a partly random model either
        load_model(check_model_dir(model), None)
    one_line(info.value, "model.norm.weight")


@pytest.mark.parametrize(
    ("shard", "named"),
    [
        ("../outside.safetensors", "climbs with '..'"),
        ("/etc/passwd", "is absolute"),
        ("sub//x.safetensors", "not a plain relative path"),
        ("weights.bin", "is not a .safetensors file"),
    ],
)
def test_an_index_naming_a_file_outside_the_model_is_refused(model: Path, shard: str, named: str) -> None:
    (model / SAFETENSORS_FILE).rename(model / "model-00001-of-00001.safetensors")
    outside = model.parent / "outside.safetensors"
    shutil.copy(model / "model-00001-of-00001.safetensors", outside)
    header, _ = header_and_data(outside)
    weight_map = {k: "model-00001-of-00001.safetensors" for k in header if k != "__metadata__"}
    weight_map["model.norm.weight"] = shard
    (model / SAFETENSORS_INDEX).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    with pytest.raises(ModelDirError) as info:
        check_model_dir(model)
    one_line(info.value, SAFETENSORS_INDEX, named)


@pytest.mark.parametrize(
    ("content", "named"),
    [
        ("[" * 100_000, "config.json is not valid JSON"),
        ('{"model_type": "llama", "x": ' + "9" * 5000 + "}", "config.json is not valid JSON"),
        ('{"model_type": "llama"', "config.json is not valid JSON"),
    ],
)
def test_a_config_json_of_any_depth_or_number_is_one_line(model: Path, content: str, named: str) -> None:
    (model / "config.json").write_text(content)
    with pytest.raises(ModelDirError) as info:
        check_model_dir(model)
    one_line(info.value, named)


# ---------------------------------------------------------------------------------------------- JSONL lines
@pytest.mark.parametrize("sep", ["\u2028", "\u2029", "\u0085", "\x0c", "\x1c", "\r"])
def test_a_line_holding_a_unicode_line_break_is_one_line(tmp_path: Path, sep: str) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps({"prompt": f"a{sep}b", "answer": "1"}, ensure_ascii=False) + "\n", encoding="utf-8")
    ds = load_jsonl(path)
    assert len(ds) == 1 and ds[0].prompt == f"a{sep}b"


@pytest.mark.parametrize(
    ("line", "named"),
    [
        ('{"prompt": ' + "[" * 100_000, "not valid JSON"),
        ('{"prompt": "x", "answer": ' + "7" * 5000 + "}", "not valid JSON"),
        ('{"prompt": "\\ud800", "answer": "1"}', "not valid JSON"),
        ('{"prompt": "x", "answer": NaN}', "not valid JSON"),
    ],
)
def test_a_hostile_jsonl_line_is_one_line_naming_it(tmp_path: Path, line: str, named: str) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text('{"prompt": "ok", "answer": "1"}\n' + line + "\n")
    with pytest.raises(DatasetError) as info:
        load_jsonl(path)
    one_line(info.value, "line 2", named)


def test_a_dataset_of_too_many_rows_is_refused_before_they_are_parsed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sc_app.rl.hf import dataset

    monkeypatch.setattr(dataset, "MAX_ROWS", 1000)
    path = tmp_path / "t.jsonl"
    path.write_text('{"prompt": "p", "answer": 1}\n' * 1001)
    with pytest.raises(DatasetError) as info:
        load_jsonl(path)
    one_line(info.value, "1,002 lines", "1,000 rows")


# ---------------------------------------------------------------------------------------------- prompts
def jsonl_task(model: Path, tmp_path: Path, prompt: str, prompt_len: int = 32) -> JsonlTask:
    from sc_app.rl.hf.model_dir import load_tokenizer

    ds = load_jsonl(write_jsonl(tmp_path / "t.jsonl", [{"prompt": prompt, "answer": "1"}]))
    tok = load_tokenizer(check_model_dir(model))
    return JsonlTask(tok, ds, resolve_reward("exact_match"), prompt_len=prompt_len, response_len=4)


TEMPLATES = {
    "syntax error": ("{% for m in messages %}{{ m['content'] }", "the chat template failed"),
    "raises": ("{{ raise_exception('no system role allowed') }}", "no system role allowed"),
    "loops": (
        "{% for a in range(100000) %}{% for b in range(100000) %}x{% endfor %}{% endfor %}",
        "ran longer than",
    ),
    "renders megabytes": ("{{ messages[0]['content'] * 2000000 }}", "rendered more than"),
}


@pytest.mark.parametrize("case", sorted(TEMPLATES))
def test_a_chat_template_that_fails_is_one_line_naming_the_prompt(
    model: Path, tmp_path: Path, case: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    template, named = TEMPLATES[case]
    (model / "chat_template.jinja").write_text(template)
    monkeypatch.setattr(chat, "TEMPLATE_SECONDS", 2.0)
    task = jsonl_task(model, tmp_path, "what is 1 + 1 ?")
    started = time.monotonic()
    with pytest.raises(DatasetError) as info:
        task.check_lengths()
    assert time.monotonic() - started < 30
    one_line(info.value, "line 1", named)


@pytest.mark.parametrize("size", [10_000, 20_000_000])
def test_a_long_prompt_is_refused_before_it_is_tokenized(model: Path, tmp_path: Path, size: int) -> None:
    task = jsonl_task(model, tmp_path, "1 " * (size // 2))
    started = time.monotonic()
    with pytest.raises(DatasetError) as info:
        task.check_lengths()
    assert time.monotonic() - started < 10
    one_line(info.value, "line 1", "characters")


def test_text_the_tokenizer_refuses_is_one_line(model: Path) -> None:
    from sc_app.rl.hf.model_dir import load_tokenizer

    tok = load_tokenizer(check_model_dir(model))
    with pytest.raises(chat.PromptError) as info:
        chat.encode_prompt(tok, "lone \ud800 surrogate", 10_000)
    one_line(info.value, "refused")


# ---------------------------------------------------------------------------------------------- rewards
REWARD_MODULE = """
import math, os, sys
def raises(*, prompt, completion, answer):
    raise KeyError("boom")
def nan(*, prompt, completion, answer):
    return math.nan
def exits(*, prompt, completion, answer):
    sys.exit(4)
def text(*, prompt, completion, answer):
    return "1.0"
def huge(*, prompt, completion, answer):
    return 10 ** 400
def none(*, prompt, completion, answer):
    return None
"""


@pytest.fixture
def user_rewards(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    name = f"hostile_rewards_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(REWARD_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


@pytest.mark.parametrize(
    ("fn", "named"),
    [
        ("raises", "KeyError: 'boom'"),
        ("nan", "returned nan"),
        ("exits", "exit(4)"),
        ("text", "returned str"),
        ("huge", "too large"),
        ("none", "returned NoneType"),
    ],
)
def test_a_failing_reward_is_a_typed_one_line_naming_it(user_rewards: str, fn: str, named: str) -> None:
    reward = resolve_reward(f"{user_rewards}:{fn}")
    with pytest.raises(RewardFailed) as info:
        reward(prompt="p", completion="c", answer="a")
    one_line(info.value, f"{user_rewards}:{fn}", named)


IMPORT_CASES = {
    "syntax error": ("def score(:\n", "SyntaxError"),
    "raises": ("raise RuntimeError('no GPU here')\n", "no GPU here"),
    "sys.exit": ("import sys\nsys.exit(0)\n", "exit(0)"),
    "os._exit(0)": ("import os\nos._exit(0)\n", "ended the process (exit code 0)"),
    "segfault": ("import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)\n", "killed by signal 11"),
    "loops": ("while True:\n    pass\n", "took more than"),
}


@pytest.mark.parametrize("case", sorted(IMPORT_CASES))
def test_a_reward_module_that_fails_on_import_is_one_line_before_ray(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str
) -> None:
    body, named = IMPORT_CASES[case]
    name = f"hostile_import_{abs(hash(case))}"
    (tmp_path / f"{name}.py").write_text(body + "def score(*, prompt, completion, answer):\n    return 1.0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(RewardError) as info:
        probe_reward(f"{name}:score", timeout=10)
    one_line(info.value, f"{name}:score", named)
    assert name not in sys.modules  # the driver never imported it
