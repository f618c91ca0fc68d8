"""The status page's view: backends, load, acceptance over time, decisions, tuning advice.

:class:`StatusPage` renders ``gateway/templates/status.html`` (Jinja2, autoescaped, no JavaScript)
from the live :class:`~gateway.service.Gateway` and an
:class:`~gateway.telemetry.history.AcceptanceHistory`. The acceptance chart is an inline SVG
polyline built here (:func:`sparkline`).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from jinja2 import Environment, PackageLoader, select_autoescape

from gateway.service import Gateway
from gateway.speculation.advisor import advise_window
from gateway.telemetry.history import AcceptanceHistory

SPARK_W, SPARK_H = 240, 48


@dataclass(frozen=True, slots=True)
class Sparkline:
    """An SVG polyline of rates in [0, 1]: ``points`` in a ``SPARK_W`` x ``SPARK_H`` box
    (y = 0 at the top, rate 1; x from the oldest shown sample to now), ``floor_y`` the
    demotion threshold's y (None without one), ``last``/``low``/``high`` the newest, lowest
    and highest rate, ``seconds`` the time the chart covers."""

    points: str
    floor_y: float | None
    last: float
    low: float
    high: float
    count: int
    seconds: float


def sparkline(
    samples: list[tuple[float, float]], now: float, span_s: float, floor: float | None
) -> Sparkline | None:
    """Scale ``(unix time, rate)`` samples (oldest first) into the chart box: the x axis
    covers the last ``span_s`` seconds, or less while the history is younger. None without
    samples."""
    if not samples:
        return None

    def y(rate: float) -> float:
        return round(SPARK_H - min(max(rate, 0.0), 1.0) * SPARK_H, 1)

    start = max(now - span_s, samples[0][0])
    width = max(now - start, 1e-9)
    points = " ".join(
        f"{round(max(t - start, 0.0) / width * SPARK_W, 1)},{y(r)}" for t, r in samples
    )
    if len(samples) == 1:  # one sample: a flat segment so it shows
        points = f"0,{y(samples[0][1])} {SPARK_W},{y(samples[0][1])}"
    rates = [r for _, r in samples]
    return Sparkline(
        points=points,
        floor_y=None if floor is None else y(floor),
        last=rates[-1],
        low=min(rates),
        high=max(rates),
        count=len(rates),
        seconds=now - start,
    )


#: The page's label (and CSS class) of each :data:`~gateway.upstream.state.Health`.
_HEALTH_LABEL = {"up": "healthy", "down": "down", "unknown": "unknown"}


def status_context(
    gateway: Gateway,
    history: AcceptanceHistory,
    processes: dict[str, dict[str, Any]] | None = None,
    sample_canary: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Everything the template shows, as plain values (``processes``: the supervisor's view
    of local backends under ``specgate up``, by name; ``sample_canary``: the distribution
    canary's ``to_json()``, None when it is off)."""
    config = gateway.config
    now = history.clock()
    backends, advice = [], []
    for view in gateway.backends():
        name, backend = view.name, view.config
        spec, acc = backend.spec, view.acceptance
        floor = backend.acceptance_floor(config.routing.min_acceptance_rate)
        backends.append(
            {
                "view": view,  # name, last_error, circuit, inflight, running, waiting, ...
                "url": backend.base_url,
                "method": spec.method,
                "k": spec.num_speculative_tokens,
                "health": _HEALTH_LABEL[view.health],
                "kv_pct": view.kv_cache_usage * 100,
                "rate": None if acc is None else acc.rate,
                "mean_length": None if acc is None else acc.mean_length,
                "floor": floor,
                "spark": sparkline(history.recent(name), now, history.span_s, floor),
                "process": (processes or {}).get(name),
            }
        )
        tip = advise_window(spec, view.window)
        if tip is not None:
            advice.append({"name": name, **tip.to_json()})
    stats = gateway.stats
    rule_names = [r.name for r in config.rules] + ["default"]
    rule_names += [r for r in stats.by_rule if r not in rule_names]
    return {
        "generated_at": datetime.fromtimestamp(now, UTC).strftime("%Y-%m-%d %H:%M:%S UTC"),
        "span_min": round(history.span_s / 60),
        "window_s": config.routing.acceptance_window_s,
        "spark_w": SPARK_W,
        "spark_h": SPARK_H,
        "backends": backends,
        "by_rule": [(r, stats.by_rule.get(r, 0)) for r in rule_names],
        "by_task": sorted(stats.by_task.items()),
        "failovers": stats.failovers,
        "rejected": stats.rejected,
        "advice": advice,
        "sample_canary": sample_canary,
        "sample_streams": _sample_streams(sample_canary),
    }


def _sample_streams(view: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The distribution canary's streams as table rows (backend, band, its view)."""
    if view is None:
        return []
    return [
        {"backend": name, "band": band, **stream}
        for name, bands in view["backends"].items()
        for band, stream in sorted(bands.items())
    ]


class StatusPage:
    """Renders the status page; owns its Jinja2 environment (one per app)."""

    def __init__(self, refresh_s: float = 5.0) -> None:
        self.refresh_s = refresh_s
        self.env = Environment(
            loader=PackageLoader("gateway", "templates"),
            autoescape=select_autoescape(default=True),
            trim_blocks=True,
            lstrip_blocks=True,
        )

    def render(
        self,
        gateway: Gateway,
        history: AcceptanceHistory,
        processes: dict[str, dict[str, Any]] | None = None,
        sample_canary: dict[str, Any] | None = None,
    ) -> str:
        """The page's HTML for the current state."""
        context = status_context(gateway, history, processes, sample_canary)
        template = self.env.get_template("status.html")
        return template.render(refresh_s=self.refresh_s, **context)
