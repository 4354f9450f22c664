"""The LoRA ids of a host's front ends (voicehost.host.lora_ids): one engine core knows an
adapter by its id alone, so every front end must give a voice version the same id, and no two
voice versions one id."""

from __future__ import annotations

import pytest

from voicehost.host.lora_ids import HostLoraIds


@pytest.mark.unit
def test_front_ends_give_a_voice_version_one_id_and_different_versions_different_ids(tmp_path):
    path = tmp_path / "lora-ids"
    HostLoraIds.create(path, capacity=8)
    first, second = HostLoraIds(path, capacity=8), HostLoraIds(path, capacity=8)
    # each front end meets voices in its own order: what one numbers, the other finds
    anna = first.id_of("anna", "c1")
    bob = second.id_of("bob", "c2")
    assert second.id_of("anna", "c1") == anna and first.id_of("bob", "c2") == bob
    assert anna != bob
    anna_2 = second.id_of("anna", "c3")  # a new version: new weights, a new id
    assert anna_2 not in (anna, bob) and first.id_of("anna", "c3") == anna_2
    assert first.id_of("anna", None) not in (anna, bob, anna_2)
    assert sorted([anna, bob, anna_2]) == [1, 2, 3]  # ids from 1, as vLLM wants them


@pytest.mark.unit
def test_a_host_that_has_numbered_all_it_can_says_so(tmp_path):
    path = tmp_path / "lora-ids"
    HostLoraIds.create(path, capacity=2)
    ids = HostLoraIds(path, capacity=2)
    ids.id_of("a", "1"), ids.id_of("b", "1")
    assert ids.id_of("a", "1") == 1  # the known ones still answer
    with pytest.raises(RuntimeError, match="numbered 2 voice versions"):
        ids.id_of("c", "1")
