"""policy.loader.PromptLoader: in-order hand-out, the place a bundle records, and the resume invariant."""

from __future__ import annotations

import pytest

from sc_app.rl.loader import LOADER_SCHEMA_VERSION, PromptLoader


def test_hands_out_indices_in_order_and_tracks_the_uncommitted() -> None:
    loader = PromptLoader()
    assert [loader.take() for _ in range(4)] == [0, 1, 2, 3]
    loader.settled(1)
    loader.settled(2)
    assert loader.pending == {0, 3}
    assert loader.state_dict() == {"schema_version": LOADER_SCHEMA_VERSION, "next_index": 4, "reissue": [0, 3]}


def test_state_dict_is_a_fresh_copy() -> None:
    loader = PromptLoader()
    loader.take()
    state = loader.state_dict()
    loader.take()
    assert state["next_index"] == 1 and state["reissue"] == [0]


def test_resume_reissues_the_uncommitted_and_skips_what_the_index_holds() -> None:
    """Every index below the largest handed out is in the restored index, was consumed, or is handed out again."""
    before = PromptLoader()
    for _ in range(6):
        before.take()
    for idx in (0, 2, 3):
        before.settled(idx)  # committed; 1, 4, 5 are in flight when the bundle is cut
    state = before.state_dict()
    restored_index = {3, 4}  # 3 committed before the cut; 4 committed between the loader note and the window
    after = PromptLoader()
    after.load_state_dict(state, skip=restored_index)
    handed = [after.take() for _ in range(4)]
    assert handed == [1, 5, 6, 7], "1 and 5 again (not 4: its group is in the index), then new prompts"


def test_skip_ahead_of_the_place_is_not_handed_out_twice() -> None:
    after = PromptLoader()
    after.load_state_dict({"schema_version": LOADER_SCHEMA_VERSION, "next_index": 3, "reissue": []}, skip={3, 5})
    assert [after.take() for _ in range(3)] == [4, 6, 7]


def test_unknown_schema_is_refused() -> None:
    with pytest.raises(ValueError, match="schema_version"):
        PromptLoader().load_state_dict({"schema_version": 99, "next_index": 0, "reissue": []}, skip=set())
