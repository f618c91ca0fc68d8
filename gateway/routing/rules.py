"""Ordered routing rules: the first rule whose conditions all hold wins."""

from __future__ import annotations

from collections.abc import Sequence

from contracts.config import Rule
from gateway.classify.features import RequestFeatures


def rule_matches(rule: Rule, features: RequestFeatures) -> bool:
    """True when every condition of ``rule.match`` holds for ``features``.

    Conditions: task in ``tasks``; temperature within the inclusive ``temperature`` range;
    model in ``models``. An absent condition always holds.
    """
    match = rule.match
    if match.tasks is not None and features.task not in match.tasks:
        return False
    if match.temperature is not None and not match.temperature.contains(features.temperature):
        return False
    return match.models is None or features.model in match.models


def first_match(rules: Sequence[Rule], features: RequestFeatures) -> Rule | None:
    """The first rule in order that matches, or None."""
    for rule in rules:
        if rule_matches(rule, features):
            return rule
    return None
