"""The bounded on-disk dataset behind prompt capture: JSONL files per task, rotated and capped.

Files are named ``<UTC creation time>-<task>.jsonl`` (``20261130T121500.123456Z-code.jsonl``),
so their names sort oldest first. A task's newest file takes lines until the next one would
take it past ``max_file_bytes``, then a new file is started; when the directory's capture files
would pass ``max_bytes``, the oldest ones are deleted first. Other files in the directory are
never touched. The directory is created 0700, files 0600.

Blocking code: :class:`CaptureStore` runs in the capture's worker thread, never on the event
loop (see :mod:`gateway.telemetry.capture`).
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from contracts.tasks import TASKS

logger = logging.getLogger(__name__)

#: A capture file's name: its creation time (UTC, microseconds) and its task.
FILE_NAME = re.compile(r"^\d{8}T\d{6}\.\d{6}Z-(" + "|".join(TASKS) + r")\.jsonl$")


@dataclass(slots=True)
class CaptureFile:
    """One capture file, its task and its size in bytes (as last seen)."""

    path: Path
    task: str
    size: int


def capture_files(root: Path) -> list[CaptureFile]:
    """The capture files in ``root``, oldest first (an absent ``root`` has none)."""
    files = []
    try:
        entries = sorted(os.scandir(root), key=lambda e: e.name)
    except FileNotFoundError:
        return []
    for entry in entries:
        match = FILE_NAME.match(entry.name)
        if match is None or not entry.is_file(follow_symlinks=False):
            continue
        try:
            size = entry.stat(follow_symlinks=False).st_size
        except FileNotFoundError:
            continue  # deleted meanwhile
        files.append(CaptureFile(Path(entry.path), match.group(1), size))
    return files


class CaptureStore:
    """Appends JSONL lines to per-task files under ``root`` within the size limits.

    Call :meth:`begin` once per batch (creates the directory, reads what is on disk: files
    deleted by hand meanwhile are noticed), then :meth:`append` per line. Both raise
    ``OSError`` on a disk error; a line that fails part-way is cut off again, so a file
    never holds a torn line.
    """

    def __init__(
        self,
        root: Path,
        max_bytes: int,
        max_file_bytes: int,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.root, self.max_bytes, self.max_file_bytes = root, max_bytes, max_file_bytes
        self.clock = clock
        self.files: list[CaptureFile] = []
        self._warned_mode = False

    def begin(self) -> None:
        """Create the directory (0700) if needed and read its capture files."""
        self.root.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.mkdir(self.root, 0o700)
            os.chmod(self.root, 0o700)  # whatever the umask
        except FileExistsError:
            mode = self.root.stat().st_mode
            if mode & 0o077 and not self._warned_mode:
                self._warned_mode = True
                logger.warning("capture: %s is readable by others (mode %o)", self.root, mode)
        self.files = capture_files(self.root)

    def fits(self, line: bytes) -> bool:
        """Whether one line can be stored at all (at most ``max_file_bytes``)."""
        return len(line) <= self.max_file_bytes

    def append(self, task: str, line: bytes) -> None:
        """Append ``line`` (a whole JSONL line) to ``task``'s current file, rotating and
        deleting the oldest files as needed. The caller checks :meth:`fits` first."""
        current = next((f for f in reversed(self.files) if f.task == task), None)
        if current is None or current.size + len(line) > self.max_file_bytes:
            current = self._new_file(task)
        self._evict(len(line), keep=current)
        fd = os.open(current.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            before = os.fstat(fd).st_size
            try:
                view = memoryview(line)
                while view:
                    view = view[os.write(fd, view) :]
            except OSError:
                os.ftruncate(fd, before)  # no torn line left behind
                raise
        finally:
            os.close(fd)
        current.size = before + len(line)

    def total(self) -> int:
        """Bytes in the capture files, as last seen."""
        return sum(f.size for f in self.files)

    def _new_file(self, task: str) -> CaptureFile:
        """Create ``task``'s next file (empty, 0600), named after the clock, or just after
        the newest file when the clock is behind it (names stay in creation order)."""
        micros = int(self.clock() * 1_000_000)
        if self.files:
            micros = max(micros, _micros(self.files[-1].path.name) + 1)
        while True:
            path = self.root / f"{_stamp(micros)}-{task}.jsonl"
            try:
                os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
            except FileExistsError:
                micros += 1
                continue
            created = CaptureFile(path, task, 0)
            self.files.append(created)
            return created

    def _evict(self, incoming: int, keep: CaptureFile) -> None:
        """Delete the oldest files (never ``keep``) until ``incoming`` more bytes fit."""
        total = self.total()
        for old in [f for f in self.files if f is not keep]:
            if total + incoming <= self.max_bytes:
                return
            try:
                old.path.unlink()
            except FileNotFoundError:
                pass  # deleted by hand meanwhile
            self.files.remove(old)
            total -= old.size


_STAMP = "%Y%m%dT%H%M%S.%fZ"


def _stamp(micros: int) -> str:
    """``20261130T121500.123456Z`` for microseconds since the epoch."""
    seconds, rest = divmod(micros, 1_000_000)
    return datetime.fromtimestamp(seconds, UTC).replace(microsecond=rest).strftime(_STAMP)


def _micros(name: str) -> int:
    """Microseconds since the epoch from a capture file's name."""
    when = datetime.strptime(name[:23], _STAMP).replace(tzinfo=UTC)
    return int(when.timestamp()) * 1_000_000 + when.microsecond
