"""The simulator's knowledge of a prompt sample: each prompt's task and output length."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from bench.sim.engine import PromptBook, prompt_key
from bench.sim.profile import SimProfile
from bench.workloads import Item, sample


def prompt_text(item: Item) -> str:
    """The text the simulator keys a request on: the completion prompt or the last message
    (what :func:`bench.sim.server.prompt_of` reads from a request body)."""
    if "prompt" in item.body:
        return str(item.body["prompt"])
    return str(item.body["messages"][-1]["content"])


def book_for(profile: SimProfile, items: Sequence[Item]) -> PromptBook:
    """A book of ``items``' prompts: their task, and the output length measured for their id
    in the profile's run, else one of that task's measured lengths picked by the prompt's
    hash (so every backend answers a prompt with the same length)."""
    known = {}
    for item in items:
        key = prompt_key(prompt_text(item))
        lengths = profile.task_lengths.get(item.task) or (64,)
        natural = profile.lengths.get(item.id, lengths[int(key[:8], 16) % len(lengths)])
        known[key] = (item.task, natural)
    return PromptBook(profile, known)


def book_from_prompts(profile: SimProfile, prompts: Path, per_task: int) -> PromptBook:
    """:func:`book_for` the :func:`bench.workloads.sample` of ``prompts`` (``per_task`` a
    task, prompts cut to 3000 characters as the benches do)."""
    return book_for(profile, sample(prompts, per_task))
