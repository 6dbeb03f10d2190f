"""hf backend: built-in rewards and the user's package.module:function, refused in one line when unusable."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from sc_app.rl.hf.rewards import RewardError, exact_match, numeric_match, resolve_reward


def test_exact_match_ignores_only_whitespace() -> None:
    assert exact_match(prompt="p", completion="  7 ", answer="7") == 1.0
    assert exact_match(prompt="p", completion="the  answer", answer="the answer") == 1.0
    assert exact_match(prompt="p", completion="7.", answer="7") == 0.0


@pytest.mark.parametrize(
    ("completion", "answer", "want"),
    [
        ("the answer is 7", "7", 1.0),
        ("4 2", "42", 1.0),  # a word-level tokenizer decodes digits with spaces between them
        ("3 then 7.0", "7", 1.0),  # the last number counts
        ("7 then 3", "7", 0.0),
        ("-12", "-12", 1.0),
        ("1,000", "1000", 1.0),
        ("no number", "7", 0.0),
        ("7", "seven", 0.0),
    ],
)
def test_numeric_match(completion: str, answer: str, want: float) -> None:
    assert numeric_match(prompt="p", completion=completion, answer=answer) == want


@pytest.fixture
def user_module(tmp_path: Path) -> Iterator[str]:
    (tmp_path / "my_rewards.py").write_text(
        "CALLS = []\n"
        "def length(*, prompt, completion, answer):\n"
        "    CALLS.append((prompt, completion, answer))\n"
        "    return len(completion)\n"
        "def positional(a, b):\n"
        "    return 1.0\n"
        "def text(*, prompt, completion, answer):\n"
        "    return 'high'\n"
        "def nan(*, prompt, completion, answer):\n"
        "    return float('nan')\n"
        "NOT_CALLABLE = 3\n"
    )
    sys.path.insert(0, str(tmp_path))
    try:
        yield "my_rewards"
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("my_rewards", None)


def test_a_user_function_is_called_with_keywords(user_module: str) -> None:
    fn = resolve_reward(f"{user_module}:length")
    assert fn(prompt="p", completion="abcd", answer="a") == 4.0
    assert sys.modules[user_module].CALLS == [("p", "abcd", "a")]


@pytest.mark.parametrize(
    ("spec", "named"),
    [
        ("no_colon", "expected exact_match or numeric_match or package.module:function"),
        ("a b:c", "expected"),
        ("surely_not_installed_xyz:fn", "cannot import surely_not_installed_xyz"),
        ("{mod}:missing", "has no attribute 'missing'"),
        ("{mod}:NOT_CALLABLE", "not a function"),
        ("{mod}:positional", "must accept keywords prompt, completion, answer"),
    ],
)
def test_unusable_specs_are_one_line(user_module: str, spec: str, named: str) -> None:
    with pytest.raises(RewardError) as info:
        resolve_reward(spec.format(mod=user_module))
    assert "\n" not in str(info.value) and named in str(info.value)


@pytest.mark.parametrize(("name", "named"), [("text", "returned str, not a number"), ("nan", "not a finite number")])
def test_bad_results_are_one_line(user_module: str, name: str, named: str) -> None:
    fn = resolve_reward(f"{user_module}:{name}")
    with pytest.raises(RewardError) as info:
        fn(prompt="p", completion="c", answer="a")
    assert "\n" not in str(info.value) and named in str(info.value)
