"""The task vocabulary: the kinds of request specgate tells apart and routes by.

Defined here once; the classifier's weight columns, config rules (``match.tasks``), capture
files, the drafts pipeline and the benchmarks all use this order.
"""

from __future__ import annotations

from typing import Literal, get_args

Task = Literal["code", "rag", "chat", "creative"]

#: Every task, in the classifier's column order.
TASKS: tuple[Task, ...] = get_args(Task)
