"""The adaptive learner's state on disk: a versioned JSON file, written atomically.

Shape (:class:`LearnedState`, validated with pydantic on load)::

    {"kind": "specgate.adaptive-routing", "version": 5, "saved_at": 1764540000.0,
     "decay": 0.98, "observations": 412,
     "groups": [{"task": "code", "bucket": "greedy/norep", "count": 37,
                 "backends": {"plain": {"at": 37, "weight": 12.1, "mean": 3.4, "m2": 0.8,
                                        "drafts": 0.0, "accepted": 0.0, "steps": 0.0,
                                        "requests": 30, "tokens": 590.2,
                                        "seconds": 17.9}}}]}

``mean``/``m2`` are the weighted mean and sum of squared deviations of ln(tokens/s); see
:class:`gateway.routing.adaptive.BackendStats` for every field. Version 3: speeds over the
whole request, time to first token included (version 2 held a stream's speed after its
first token, on another scale: such a file is set aside, not mixed in). Version 4: load
bands half as wide from 16 on (:data:`gateway.routing.adaptive.BANDS`); a version-3 state
is read without the groups of its 16, 32 and 64 bands, whose names now mean narrower
ranges (:func:`restore_state`). Version 5: decayed output ``tokens`` and request ``seconds``,
whose ratio routing compares (:attr:`gateway.routing.adaptive.BackendStats.log_speed`); an
older state reads them as 0 and its records are taken at their geometric mean until they
learn again. A probe's mark (a record of no request:
:meth:`gateway.routing.adaptive.Learner.mark_probed`) is kept like any record.

Writing goes to a temporary file in the same directory, flushed and fsynced, then
``os.replace``d over the old one (atomic on POSIX), so a crash mid-write leaves the old file
or the new one, never half of one. Loading a file that is unreadable, not JSON, of another
``kind`` or a ``version`` other than 3 to 5, or malformed sets it aside (renamed
``NAME.unreadable-<unix time>``) with a warning and starts fresh: learning again costs
some exploration; refusing to start would cost the service.

Replicas: each gateway process keeps its own state. Two replicas must not share one file
(the last writer wins, and each would overwrite what the other learnt); see the README.
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
import time
from pathlib import Path
from typing import Final, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gateway.routing.adaptive import BackendStats, GroupStats, Learner, bucket_load

logger = logging.getLogger(__name__)

KIND: Final = "specgate.adaptive-routing"
VERSION: Final = 5
#: Load bands whose range version 3 read wider (16-31, 32-63, 64-127; now 16-23, 32-47 and
#: 64-95: :data:`gateway.routing.adaptive.BANDS`): their groups are dropped on restoring a
#: version-3 state, as they mix loads the narrower bands keep apart.
_WIDER_IN_V3: Final = frozenset({16, 32, 64})


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, from_attributes=True)


class StoredBackend(_Frozen):
    """One backend's decayed statistics in one group (fields of ``BackendStats``)."""

    at: int = Field(ge=0)
    weight: float = Field(ge=0)
    mean: float
    m2: float = Field(ge=0)
    drafts: float = Field(ge=0)
    accepted: float = Field(ge=0)
    steps: float = Field(ge=0)
    requests: int = Field(ge=0)
    tokens: float = Field(default=0.0, ge=0)
    seconds: float = Field(default=0.0, ge=0)


class StoredGroup(_Frozen):
    """One (task, bucket) group: its observation count and its backends."""

    task: str
    bucket: str
    count: int = Field(ge=0)
    backends: dict[str, StoredBackend]


class LearnedState(_Frozen):
    """The whole file. ``saved_at``: Unix seconds; ``decay``: the learner's at save time."""

    kind: Literal["specgate.adaptive-routing"]
    version: Literal[3, 4, 5]
    saved_at: float
    decay: float = Field(gt=0, le=1)
    observations: int = Field(ge=0)
    groups: list[StoredGroup]


def dump_state(learner: Learner, now: float | None = None) -> LearnedState:
    """The learner's state as a :class:`LearnedState` (``now``: Unix seconds)."""
    groups = [
        StoredGroup.model_validate(
            {"task": task, "bucket": bucket, "count": group.count, "backends": group.backends}
        )
        for (task, bucket), group in learner.groups.items()
    ]
    return LearnedState(
        kind=KIND,
        version=VERSION,
        saved_at=time.time() if now is None else now,
        decay=learner.decay,
        observations=learner.observations,
        groups=groups,
    )


def restore_state(learner: Learner, state: LearnedState) -> None:
    """Replace ``learner``'s estimates with ``state``'s (its own ``decay`` is kept: the
    config's knob applies from now on). From a version-3 state (a file, or a peer not yet
    upgraded) the groups of the load bands since narrowed are left out."""
    learner.groups = {
        (g.task, g.bucket): GroupStats(
            g.count, {name: BackendStats(**s.model_dump()) for name, s in g.backends.items()}
        )
        for g in state.groups
        if state.version > 3 or bucket_load(g.bucket) not in _WIDER_IN_V3
    }
    learner.observations = state.observations


class LearningStore:
    """Loads and saves one learner's state at ``path``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.saved_changes: int | None = None  # learner.changes at the last save

    def load(self, learner: Learner) -> bool:
        """Fill ``learner`` from the file; False (learner untouched) when there is none or it
        was set aside."""
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return False
        except OSError as exc:
            logger.warning("adaptive state %s not readable (%s): learning afresh", self.path, exc)
            return False
        try:
            state = LearnedState.model_validate_json(raw)
        except ValidationError as exc:
            aside = self.set_aside()
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "<root>"
            logger.warning(
                "adaptive routing state %s is not a version-%d specgate state (%s: %s); "
                "set aside as %s, learning afresh",
                self.path,
                VERSION,
                where,
                first["msg"],
                aside,
            )
            return False
        restore_state(learner, state)
        self.saved_changes = learner.changes
        logger.info(
            "adaptive routing state loaded from %s (%d observations, %d groups)",
            self.path,
            state.observations,
            len(state.groups),
        )
        if state.version < VERSION:
            logger.info(
                "adaptive routing state %s is version %d: %d groups of load bands since "
                "narrowed (16, 32, 64) left out, speeds read at their geometric mean until "
                "learnt again; saved as version %d from now on",
                self.path,
                state.version,
                len(state.groups) - len(learner.groups),
                VERSION,
            )
        return True

    def set_aside(self) -> Path | None:
        """Rename the file to ``NAME.unreadable-<unix time>``; None if that failed."""
        aside = self.path.with_name(f"{self.path.name}.unreadable-{int(time.time())}")
        try:
            os.replace(self.path, aside)
        except OSError:
            return None
        return aside

    def snapshot(self, learner: Learner) -> bytes | None:
        """The bytes to write now, or None when nothing was learnt since the last save (or
        ever: a gateway that served nothing leaves no file)."""
        if self.saved_changes == learner.changes:
            return None
        if self.saved_changes is None and learner.changes == 0:
            return None
        self.saved_changes = learner.changes
        return dump_state(learner).model_dump_json().encode()

    def write(self, data: bytes) -> None:
        """Write ``data`` atomically (temporary file, fsync, ``os.replace``); an OSError is
        logged, not raised (routing goes on without persistence)."""
        tmp: str | None = None
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", dir=self.path.parent)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
            tmp = None
        except OSError as exc:
            self.saved_changes = None  # try again next time
            logger.warning("adaptive routing state not saved to %s: %s", self.path, exc)
        finally:
            if tmp is not None:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)

    def save(self, learner: Learner) -> None:
        """Write the learner's state now (synchronously) if it changed."""
        data = self.snapshot(learner)
        if data is not None:
            self.write(data)
