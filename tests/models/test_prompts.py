"""The prompt encoder's on-disk store: what it keeps, what it refuses, and that a hit skips the encoder."""

from __future__ import annotations

import json

import numpy as np
import pytest

from worldcast.models.spec import ConditioningRequest
from worldcast.models.tinyworld.prompts import PROMPT_DIM, EmbeddingStore, PromptEncoder, encoder_key


def unit(seed: int) -> np.ndarray:
    v = np.random.default_rng(seed).standard_normal(PROMPT_DIM).astype(np.float32)
    return v / np.linalg.norm(v)


def test_a_kept_embedding_reads_back_bit_for_bit_in_a_new_store(tmp_path) -> None:
    path = tmp_path / "sub" / "emb.json"
    v = unit(0)
    EmbeddingStore(path).put("a green meadow", v)
    got = EmbeddingStore(path).get("a green meadow")
    assert got is not None and got.dtype == np.float32
    assert np.array_equal(got, v)
    assert EmbeddingStore(path).get("a snowy landscape") is None
    assert json.loads(path.read_text())["encoder"] == encoder_key()


@pytest.mark.parametrize("content", [
    "{not json",
    json.dumps(["a list"]),
    json.dumps({"encoder": "another encoder", "embeddings": {"t": [1.0] + [0.0] * (PROMPT_DIM - 1)}}),
    json.dumps({"encoder": "KEY", "embeddings": {"t": [1.0] * 3}}),  # wrong length
    json.dumps({"encoder": "KEY", "embeddings": {"t": [2.0] + [0.0] * (PROMPT_DIM - 1)}}),  # not unit norm
    json.dumps({"encoder": "KEY", "embeddings": {"t": ["x"] * PROMPT_DIM}}),
    json.dumps({"encoder": "KEY", "embeddings": "t"}),
    json.dumps({"encoder": "KEY", "embeddings": {"t": [True] + [False] * (PROMPT_DIM - 1)}}),  # bools
    json.dumps({"encoder": "KEY", "embeddings": {"t": [3.5e38] + [0.0] * (PROMPT_DIM - 1)}}),  # past float32
    '{"encoder": "KEY", "embeddings": {"t": [' + str(10 ** 400) + ', 0]}}',  # an integer no float holds
    '{"encoder": "KEY", "embeddings": {"t": [NaN' + ', 0.0' * (PROMPT_DIM - 1) + ']}}',
    '{"encoder": "KEY", "embeddings": ' + "[" * 100_000 + "]" * 100_000 + '}',  # too deep for the parser
    json.dumps({"encoder": "KEY", "embeddings": {"t": [0.9999] + [0.0] * (PROMPT_DIM - 1)}}),  # not unit enough
])
def test_a_store_ignores_files_and_entries_it_cannot_trust_and_replaces_them(tmp_path, content: str) -> None:
    path = tmp_path / "emb.json"
    path.write_text(content.replace("KEY", encoder_key()))
    store = EmbeddingStore(path)
    assert store.get("t") is None
    store.put("t", unit(1))
    assert np.array_equal(EmbeddingStore(path).get("t"), unit(1))


def test_a_store_keeps_the_newest_entries_only(tmp_path) -> None:
    store = EmbeddingStore(tmp_path / "emb.json", max_entries=2)
    for i in range(3):
        store.put(f"t{i}", unit(i))
    store.put("t1", unit(1))  # written again: now the newest
    assert store.get("t0") is None
    assert np.array_equal(store.get("t1"), unit(1)) and np.array_equal(store.get("t2"), unit(2))
    assert len(json.loads((tmp_path / "emb.json").read_text())["embeddings"]) == 2


def test_an_unwritable_store_costs_nothing_but_the_saving(tmp_path, caplog) -> None:  # type: ignore[no-untyped-def]
    blocker = tmp_path / "file"
    blocker.write_text("")
    store = EmbeddingStore(blocker / "emb.json")  # its folder cannot be made: a file is in the way
    for _ in range(3):
        store.put("t", unit(0))  # logged once, not raised, not tried again
    assert store.get("t") is None
    assert sum("could not write" in r.message for r in caplog.records) == 1


def test_a_failed_write_leaves_no_temporary_file(tmp_path) -> None:
    (tmp_path / "emb.json").mkdir()  # a folder where the file should be: the rename fails
    EmbeddingStore(tmp_path / "emb.json").put("t", unit(0))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["emb.json"]


def test_a_store_needs_room_for_one_entry(tmp_path) -> None:
    with pytest.raises(ValueError, match="max_entries must be >= 1"):
        EmbeddingStore(tmp_path / "emb.json", max_entries=0)


def test_the_store_path_follows_xdg_and_is_none_without_a_home(monkeypatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from pathlib import Path

    from worldcast.models.tinyworld import prompts

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert prompts.default_store_path() == tmp_path / "worldcast" / "prompt-embeddings.json"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/cache")  # the XDG spec: relative values are ignored
    monkeypatch.setattr(Path, "home", classmethod(lambda cls: tmp_path / "home"))
    assert prompts.default_store_path() == tmp_path / "home" / ".cache" / "worldcast" / "prompt-embeddings.json"

    def no_home(cls):  # type: ignore[no-untyped-def]
        raise RuntimeError("Could not determine home directory.")

    monkeypatch.setattr(Path, "home", classmethod(no_home))
    assert prompts.default_store_path() is None
    from worldcast.models.tinyworld import TinyWorldModel

    assert TinyWorldModel.from_pretrained().prompts.store is None  # still builds; keeps nothing


def test_a_hit_is_a_copy_the_caller_may_change(tmp_path) -> None:
    store = EmbeddingStore(tmp_path / "emb.json")
    store.put("t", unit(0))
    a = store.get("t")
    a[:] = 0
    assert np.array_equal(store.get("t"), unit(0))


def test_the_default_prompt_is_kept_and_read_back_without_loading_the_encoder(tmp_path) -> None:
    from worldcast.models.tinyworld import TinyWorldModel

    path = tmp_path / "emb.json"
    first = TinyWorldModel.from_pretrained()
    first.prompts = PromptEncoder(EmbeddingStore(path))
    default = first.encode_conditioning(ConditioningRequest())["prompt"]
    other = first.encode_conditioning(ConditioningRequest(text="a snowy landscape"))["prompt"]
    assert first.prompts.loaded
    kept = json.loads(path.read_text())["embeddings"]
    assert list(kept) == [first.spec.default_prompt]  # a user's prompt is never written

    second = TinyWorldModel.from_pretrained()
    second.prompts = PromptEncoder(EmbeddingStore(path))
    again = second.encode_conditioning(ConditioningRequest())["prompt"]
    assert not second.prompts.loaded  # the store answered
    assert np.array_equal(again, default)
    assert not np.allclose(again, other)
    second.load_encoders()  # what the session manager calls at start
    assert second.prompts.loaded
    assert np.allclose(second.encode_prompt(first.spec.default_prompt), default, atol=1e-6)
