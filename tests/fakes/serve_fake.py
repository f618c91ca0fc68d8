"""Run one fake vLLM server as its own process (so a test can SIGKILL it).

``python -m tests.fakes.serve_fake --port P [--tokens N] [--delay-s S] [--name NAME]``
"""

from __future__ import annotations

import argparse

import uvicorn

from tests.fakes.fake_vllm import FakeBehaviour, create_fake_vllm


def main() -> None:
    """Parse the flags and serve until killed."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--delay-s", type=float, default=0.0)
    parser.add_argument("--name", default="fake")
    args = parser.parse_args()
    behaviour = FakeBehaviour(name=args.name, tokens=args.tokens, delay_s=args.delay_s)
    uvicorn.run(create_fake_vllm(behaviour), host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
