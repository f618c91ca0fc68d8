"""Process settings for the gateway, read from ``SPECGATE_*`` environment variables."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    """Where the gateway listens, which config it routes by, and its upstream timeouts.

    Every field reads ``SPECGATE_<NAME>`` (e.g. ``SPECGATE_PORT=8000``). Durations are seconds.
    There is no total-duration cap on a generation: long generations are legitimate; the
    read timeout bounds the wait for the first byte and the gap between stream chunks.
    """

    model_config = SettingsConfigDict(env_prefix="SPECGATE_", extra="ignore")

    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    config: Path = Path("config/local.yaml")
    connect_timeout_s: float = Field(default=3.0, gt=0)
    read_timeout_s: float = Field(default=120.0, gt=0)
    health_interval_s: float = Field(default=2.0, gt=0)
    health_timeout_s: float = Field(default=1.0, gt=0)
    max_body_bytes: int = Field(default=8 * 1024 * 1024, ge=1024)
    max_connections: int = Field(default=512, ge=1)
    log_level: str = "info"
    cache_dir: Path | None = (
        None  # vLLM venv, local models, backend logs; default ~/.cache/specgate
    )
