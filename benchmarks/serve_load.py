"""`crucible bench serve`: an async load generator for any OpenAI-compatible server (loopback only).

For each concurrency level it keeps that many streaming chat requests in flight until a request count
or a time limit is reached, and reports time to first token (p50/p99), inter-token latency (p50/p99),
output tokens per second, requests per second and errors. Every prompt starts with a unique tag so no
server can skip prefill through a prompt cache, and every request opens its own connection (some
servers close streamed connections).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from urllib.parse import urlparse

import numpy as np

from crucible.core.atomic_write import write_text_atomic

TOPICS = ("the history of Paris", "how rainbows form", "the rules of chess", "why the sea is salty",
          "how bread rises", "the life of a honeybee", "what makes a good story", "how computers add numbers")


@dataclass(frozen=True)
class LoadConfig:
    """One load run.

    Attributes:
        base_url: Server root, e.g. http://127.0.0.1:8000 (must be loopback).
        model: Model id to request.
        concurrency: Streams in flight.
        max_requests: Requests per level at most.
        max_seconds: Seconds per level at most.
        max_tokens: Tokens asked per request (ignore_eos is not sent: servers differ on it).
        api_key: Bearer key if the server needs one.
        seed: Prompt mix seed.
    """

    base_url: str
    model: str
    concurrency: int
    max_requests: int = 64
    max_seconds: float = 120.0
    max_tokens: int = 128
    api_key: str | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        host = urlparse(self.base_url).hostname
        if host not in ("127.0.0.1", "localhost", "::1"):
            raise ValueError(f"the load generator only targets loopback servers, not {host!r}")
        if self.concurrency < 1 or self.max_requests < 1:
            raise ValueError("concurrency and max_requests must be >= 1")


@dataclass
class RequestTiming:
    ttft_s: float | None = None
    itl_s: list[float] = field(default_factory=list)
    output_tokens: int = 0
    total_s: float = 0.0
    error: str | None = None


@dataclass(frozen=True)
class LoadResult:
    """Aggregate numbers of one concurrency level."""

    concurrency: int
    requests: int
    errors: int
    duration_s: float
    output_tokens: int
    output_tok_per_s: float
    requests_per_s: float
    ttft_p50_s: float | None
    ttft_p99_s: float | None
    itl_p50_s: float | None
    itl_p99_s: float | None
    first_error: str | None = None  # the first failed request's error, cut to 300 characters
    rep: int = 0  # which repetition of a multi-rep comparison (serve_compare.py)


def make_prompt(i: int, rng: random.Random) -> str:
    """A chat prompt of mixed length with a unique leading tag."""
    topic = rng.choice(TOPICS)
    filler = " ".join(rng.choice(TOPICS) for _ in range(rng.randint(0, 12)))
    return f"[req-{i}-{rng.randrange(1 << 30)}] Please explain {topic}. Context: {filler}"


async def _one(client, cfg: LoadConfig, prompt: str) -> RequestTiming:
    import httpx

    t = RequestTiming()
    body = {"model": cfg.model, "messages": [{"role": "user", "content": prompt}], "max_tokens": cfg.max_tokens,
            "stream": True, "temperature": 0.0, "stream_options": {"include_usage": True}}
    headers = {"Authorization": f"Bearer {cfg.api_key}"} if cfg.api_key else {}
    start = last = time.perf_counter()
    chunks, usage_tokens = 0, None
    try:
        # A fresh connection per request (llama-server closes streamed connections).
        async with httpx.AsyncClient(timeout=600) as fresh:
            async with fresh.stream("POST", cfg.base_url + "/v1/chat/completions", json=body, headers=headers) as r:
                if r.status_code != 200:
                    t.error = f"HTTP {r.status_code}: {(await r.aread())[:200]!r}"
                    return t
                async for line in r.aiter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    chunk = json.loads(line[6:])
                    if chunk.get("usage"):
                        usage_tokens = chunk["usage"].get("completion_tokens")
                    choices = chunk.get("choices") or []
                    if not choices or not (choices[0].get("delta") or {}).get("content"):
                        continue
                    now = time.perf_counter()
                    if t.ttft_s is None:
                        t.ttft_s = now - start
                    else:
                        t.itl_s.append(now - last)
                    last = now
                    chunks += 1
        # The server's own count when it reports usage (a chunk may carry several tokens), else chunks.
        t.output_tokens = usage_tokens if usage_tokens else chunks
    except Exception as exc:  # noqa: BLE001 - counted as an error of the run
        t.error = repr(exc)
    t.total_s = time.perf_counter() - start
    return t


async def run_level(cfg: LoadConfig) -> LoadResult:
    """Runs one concurrency level to its request or time limit."""
    rng = random.Random(cfg.seed * 1000 + cfg.concurrency)
    timings: list[RequestTiming] = []
    issued = 0
    start = time.perf_counter()

    async def worker() -> None:
        nonlocal issued
        while issued < cfg.max_requests and time.perf_counter() - start < cfg.max_seconds:
            i = issued
            issued += 1
            timings.append(await _one(None, cfg, make_prompt(i, rng)))

    await asyncio.gather(*(worker() for _ in range(cfg.concurrency)))
    duration = time.perf_counter() - start
    ok = [t for t in timings if t.error is None]
    ttft = [t.ttft_s for t in ok if t.ttft_s is not None]
    itl = [x for t in ok for x in t.itl_s]
    tokens = sum(t.output_tokens for t in ok)
    pct = lambda xs, q: float(np.percentile(xs, q)) if xs else None  # noqa: E731
    return LoadResult(cfg.concurrency, len(timings), len(timings) - len(ok), duration, tokens, tokens / duration,
                      len(ok) / duration, pct(ttft, 50), pct(ttft, 99), pct(itl, 50), pct(itl, 99),
                      next((t.error[:300] for t in timings if t.error), None))


def run_load(base_url: str, model: str, levels: list[int], max_requests: int, max_seconds: float,
             max_tokens: int, api_key: str | None = None, rep: int = 0) -> list[LoadResult]:
    """Runs every concurrency level in turn (a short warm-up request first); rep labels the results."""
    out = []
    asyncio.run(run_level(LoadConfig(base_url, model, 1, 1, 60, 4, api_key)))  # warm-up, not reported
    for c in levels:
        r = asyncio.run(run_level(LoadConfig(base_url, model, c, max(max_requests, c), max_seconds,
                                             max_tokens, api_key)))
        out.append(dataclasses.replace(r, rep=rep))
    return out


def format_results(system: str, results: list[LoadResult]) -> str:
    ms = lambda v: "-" if v is None else f"{v * 1000:.0f}"  # noqa: E731
    lines = [f"{'system':<12}{'conc':>5}{'reqs':>6}{'errs':>5}{'out tok/s':>11}{'req/s':>7}"
             f"{'TTFT p50':>10}{'TTFT p99':>10}{'ITL p50':>9}{'ITL p99':>9}  (ms)"]
    for r in results:
        lines.append(f"{system:<12}{r.concurrency:>5}{r.requests:>6}{r.errors:>5}{r.output_tok_per_s:>11.1f}"
                     f"{r.requests_per_s:>7.2f}{ms(r.ttft_p50_s):>10}{ms(r.ttft_p99_s):>10}"
                     f"{ms(r.itl_p50_s):>9}{ms(r.itl_p99_s):>9}")
    return "\n".join(lines)


def write_json(path: Path, system: str, results: list[LoadResult], extra: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    data = json.loads(path.read_text()) if path.exists() else {"systems": {}}
    data["systems"][system] = {"results": [asdict(r) for r in results], **extra}
    write_text_atomic(path, json.dumps(data, indent=1))
