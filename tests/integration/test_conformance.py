"""Differential conformance: a corpus of requests sent to a real vLLM CPU backend directly and
through specgate (in front of the real plain, ngram, draft and eagle3 servers); see
``tests/integration/conformance.py`` for the corpus, the comparison and the differences
that are on purpose. Prints a table of what matched (``pytest -s`` or ``-rA`` shows it)."""

from __future__ import annotations

import httpx
import pytest

from contracts.config import GatewayConfig
from tests.integration.conformance import ON_PURPOSE, Answer, compare, corpus, send
from tests.integration.conftest import backend_url

pytestmark = pytest.mark.integration


def _cell(answer: Answer) -> str:
    if answer.events:
        first = answer.events[0][1]
        error = "error" in first if isinstance(first, dict) else False
        return f"{answer.status} SSE{' error' if error else ''} ({len(answer.events)} ev)"
    return f"{answer.status} {answer.content_type.split('/')[-1]}"


def test_conformance(
    stack_config: GatewayConfig, gateway_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    plain, ngram = backend_url(stack_config, "plain"), backend_url(stack_config, "ngram")
    rows, failures = [], []
    with httpx.Client(timeout=120) as client:
        schema = client.get(f"{plain}/openapi.json").json()
        paths = {p: list(item) for p, item in schema["paths"].items()}
        for case in corpus(paths):
            direct = send(client, plain, case)
            through = send(client, gateway_url, case)
            spec = send(client, ngram, case) if "issue ex. 1" in case.name else None
            diffs = compare(direct, through, case)
            if not diffs:
                verdict = "match"
            elif case.expect is not None:
                verdict = f"differs on purpose ({case.expect})"
            else:
                verdict = "MISMATCH: " + "; ".join(diffs)
                failures.append(f"{case.name}: {'; '.join(diffs)}")
            rows.append((case.name, _cell(direct), _cell(through), spec, verdict))
    with capsys.disabled():
        print("\n\n| request | vLLM plain direct | via specgate | vLLM ngram direct | result |")
        print("|---|---|---|---|---|")
        for name, direct_cell, through_cell, spec, verdict in rows:
            spec_cell = "" if spec is None else _cell(spec)
            print(f"| {name} | {direct_cell} | {through_cell} | {spec_cell} | {verdict} |")
        matched = sum(1 for row in rows if row[-1] == "match")
        print(f"\n{matched}/{len(rows)} match; on purpose:")
        for key, why in ON_PURPOSE.items():
            print(f"- {key}: {why}")
    assert not failures, failures
