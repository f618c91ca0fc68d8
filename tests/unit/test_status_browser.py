"""The status page in a real headless Chromium (Debian's ``chromium`` + ``chromium-driver``,
installed by scripts/ci-deps.sh), against the gateway and fake backends on real sockets.

No browser is downloaded: selenium drives /usr/bin/chromium through /usr/bin/chromedriver.
Without them the test is skipped locally and fails under CI (``CI`` set).
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from contracts.config import parse_config
from gateway.app import create_app
from gateway.settings import Settings
from tests.fakes.fake_vllm import FakeBehaviour, create_fake_vllm
from tests.fakes.servers import running_server
from tests.fakes.vllm_metrics import vllm_metrics_page

pytestmark = pytest.mark.browser

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
MODEL = "smollm2-135m-instruct"
#: Chromium flags that work in this sandbox (no GPU, no network but loopback, root user).
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--window-size=1500,1100",
)


def require_chromium() -> None:
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not shutil.which(p)]
    if not missing:
        return
    message = f"missing {missing}: run scripts/ci-deps.sh"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


@dataclass
class Page:
    gateway: str
    fakes: dict[str, FakeBehaviour]


def speculative_config(plain: str, ngram: str, draft: str) -> dict:  # type: ignore[type-arg]
    return {
        "defaults": {"pool": "plain"},
        "routing": {"min_draft_tokens": 200},
        "backends": {
            "plain": {"url": plain, "model": MODEL},
            "ngram": {
                "url": ngram,
                "model": MODEL,
                "min_acceptance_rate": 0.15,
                "speculation": {
                    "method": "ngram",
                    "num_speculative_tokens": 5,
                    "prompt_lookup_min": 2,
                    "prompt_lookup_max": 4,
                },
            },
            "draft": {
                "url": draft,
                "model": MODEL,
                "speculation": {
                    "method": "draft_model",
                    "model": "draft-8l",
                    "num_speculative_tokens": 3,
                },
            },
        },
        "pools": {"plain": ["plain"], "spec": ["ngram", "draft"]},
        "rules": [{"name": "code-spec", "match": {"tasks": ["code"]}, "pool": "spec"}],
    }


@pytest.fixture
def page() -> Iterator[Page]:
    """Fakes whose /metrics start at zero counters; after the gateway's first poll they show
    the H200 ngram figures (per position 0.74 0.61 0.48 0.39 0.34 over 1000 drafts) and a
    bad draft (1.5% acceptance)."""
    fakes = {n: FakeBehaviour(name=n) for n in ("plain", "ngram", "draft")}
    fakes["plain"].metrics_text = vllm_metrics_page(running=1)
    fakes["ngram"].metrics_text = vllm_metrics_page(drafts=0, accepted_per_pos=(0,) * 5)
    fakes["draft"].metrics_text = vllm_metrics_page(drafts=0, accepted_per_pos=(0,) * 3)
    with (
        running_server(create_fake_vllm(fakes["plain"])) as plain,
        running_server(create_fake_vllm(fakes["ngram"])) as ngram,
        running_server(create_fake_vllm(fakes["draft"])) as draft,
    ):
        config = parse_config(speculative_config(plain, ngram, draft))
        app = create_app(Settings(health_interval_s=0.2), config=config)
        with running_server(app) as url:
            fakes["ngram"].metrics_text = vllm_metrics_page(
                drafts=1000,
                accepted_per_pos=(740, 610, 480, 390, 340),
                running=2,
                kv_cache_usage=0.25,
            )
            fakes["draft"].metrics_text = vllm_metrics_page(drafts=400, accepted_per_pos=(12, 4, 2))
            yield Page(url, fakes)


def wait_for_acceptance(url: str, names: set[str], timeout_s: float = 10.0) -> dict:  # type: ignore[type-arg]
    deadline = time.monotonic() + timeout_s
    while True:
        routes = httpx.get(f"{url}/routes").json()
        measured = {b["name"] for b in routes["backends"] if b["acceptance"]}
        if names <= measured or time.monotonic() > deadline:
            return routes
        time.sleep(0.1)


def test_status_page_in_chromium(page: Page, tmp_path: Path) -> None:
    require_chromium()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By

    routes = wait_for_acceptance(page.gateway, {"ngram", "draft"})
    by_name = {b["name"]: b for b in routes["backends"]}
    assert by_name["ngram"]["acceptance"]["rate"] == pytest.approx(0.512)
    for task in ("code", "code", "chat"):
        httpx.post(
            f"{page.gateway}/v1/completions",
            json={"model": MODEL, "prompt": "x", "max_tokens": 4, "temperature": 0},
            headers={"x-task-type": task},
        ).raise_for_status()
    time.sleep(0.5)  # a few more history samples for the chart

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (*FLAGS, f"--user-data-dir={tmp_path / 'profile'}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    try:
        driver.get(f"{page.gateway}/status")
        assert driver.title == "specgate status"
        rows = {
            row.get_attribute("data-backend"): row.text
            for row in driver.find_elements(By.CSS_SELECTOR, "#backends tr[data-backend]")
        }
        assert set(rows) == {"plain", "ngram", "draft"}
        assert all("healthy" in text for text in rows.values())
        assert "51.2%" in rows["ngram"] and "3.56" in rows["ngram"]
        assert "1.5%" in rows["draft"] and "demoted" in rows["draft"]
        assert "plain decoding" in rows["plain"]
        lines = driver.find_elements(By.CSS_SELECTOR, '#backends tr[data-backend="ngram"] polyline')
        assert len(lines) == 1 and len(lines[0].get_attribute("points").split()) >= 2
        advice = {
            row.get_attribute("data-backend"): row
            for row in driver.find_elements(By.CSS_SELECTOR, "#advice tr[data-backend]")
        }
        assert set(advice) == {"ngram", "draft"}
        recommended = advice["draft"].find_element(By.CSS_SELECTOR, ".recommended").text
        assert recommended == "1"
        assert "change the draft" in advice["draft"].text
        assert '{"method":"draft_model","model":"draft-8l","num_speculative_tokens":1}' in (
            advice["draft"].text
        )
        assert advice["ngram"].find_element(By.CSS_SELECTOR, ".recommended").text == "5"
        by_rule = driver.find_element(By.ID, "by-rule").text
        assert "code-spec 2" in by_rule and "default 1" in by_rule
        assert "chat 1" in driver.find_element(By.ID, "by-task").text
        shot = tmp_path / "status.png"
        assert driver.save_screenshot(str(shot)) and shot.stat().st_size > 10_000
    finally:
        driver.quit()
