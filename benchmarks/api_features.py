"""`crucible bench api`: what the agent-facing API features cost, in-process on one engine.

1. Decode step time at 1 and 16 streams: free sampling, grammar-constrained (a JSON schema whose string
   must run 400+ characters, so the grammar never ends inside the window) and every penalty at once
   (presence, frequency, repetition, logit_bias, min_p). The configurations take turns in rounds on
   the same engine so a noisy host hits all alike; each step is timed whole (schedule, execute, logits
   processing, sampling, detokenizing), and the host time of the logits processing alone is reported
   next to it. The target is constrained <= 1.10x free.
2. Time to first token of a request whose ~1,000-token system prompt was seen before (prefix caching)
   against the first time, and against the engine without prefix caching. The target is <= 0.3x.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

from crucible.core.registry import DEFAULT_MODEL
from pipelines.engine import EngineConfig, LLMEngine
from pipelines.grammar import Grammar
from pipelines.sampling import SamplingParams

LONG_STRING = Grammar.json_schema({"type": "object", "properties": {"story": {"type": "string", "minLength": 400}},
                                   "required": ["story"], "additionalProperties": False})
CONFIGS: dict[str, dict] = {
    "free": {},
    "json_schema": {"grammar": LONG_STRING},
    "penalties": {"presence_penalty": 0.5, "frequency_penalty": 0.5, "repetition_penalty": 1.1, "min_p": 0.05,
                  "logit_bias": {"42": 5.0, "1000": -5.0}},
}
SYSTEM = ("You are a meticulous assistant for a city library. Follow the house rules below exactly. " * 2
          + "Rule {i}: answer in plain sentences, cite the shelf code of every book you name, and never "
            "guess a date you do not know. ")


@dataclass(frozen=True)
class ApiBenchConfig:
    """What to run.

    Attributes:
        model: Registry name or model path.
        streams: Stream counts to time the decode step at.
        steps: Decode steps timed per configuration and round.
        rounds: Rounds (every configuration runs once per round).
        system_tokens: Approximate length of the shared system prompt.
    """

    model: str = DEFAULT_MODEL
    streams: tuple[int, ...] = (1, 16)
    steps: int = 32
    rounds: int = 3
    system_tokens: int = 1000

    def __post_init__(self) -> None:
        if not self.streams or min(self.streams) < 1 or self.steps < 2 or self.rounds < 1:
            raise ValueError("need streams >= 1, steps >= 2 and rounds >= 1")


def _decode_steps(engine: LLMEngine, streams: int, steps: int, fields: dict) -> tuple[list[float], list[float]]:
    """Step times [s] and logits-processing times [s] of `steps` decode steps of `streams` sequences."""
    prompt = engine.tokenizer.encode("Write a long story about a lighthouse keeper.", add_special_tokens=False)
    params = SamplingParams(temperature=0.8, seed=0, max_tokens=steps + 4, ignore_eos=not fields.get("grammar"),
                            **fields)
    reqs = [engine.submit(prompt, params) for _ in range(streams)]
    while any(r.in_prefill or r.state.value == "waiting" for r in reqs):
        engine.step()
    processing: list[float] = []
    real = engine._process_logits

    def timed(rows):
        start = time.perf_counter()
        try:
            return real(rows)
        finally:
            processing.append(time.perf_counter() - start)

    engine._process_logits = timed
    times = []
    try:
        for _ in range(steps):
            start = time.perf_counter()
            engine.step()
            times.append(time.perf_counter() - start)
    finally:
        del engine._process_logits
        for r in reqs:
            engine.abort(r.request_id)
        while engine.has_work:
            engine.step()
    return times, processing


def _ttft(engine: LLMEngine, system: str, question: str) -> float:
    from crucible.core.tokenizer import encode_prompt

    ids = encode_prompt(engine.tokenizer, [{"role": "system", "content": system},
                                           {"role": "user", "content": question}])
    req = engine.submit(ids, SamplingParams(temperature=0, max_tokens=1))
    while engine.has_work:
        engine.step()
    return req.first_token_time - req.arrival


def _system_prompt(engine: LLMEngine, tokens: int, salt: int) -> str:
    text, i = f"Session {salt}. ", 0
    while len(engine.tokenizer.encode(text, add_special_tokens=False)) < tokens:
        text += SYSTEM.format(i=i)
        i += 1
    return text


def run_api_bench(cfg: ApiBenchConfig, log: Callable[[str], None] = print) -> dict[str, object]:
    """Runs both parts; returns {"decode": {streams: {config: stats}}, "prefix": {...}}."""
    engine = LLMEngine(EngineConfig(model=cfg.model, max_batch_size=max(cfg.streams), max_step_tokens=512))
    plain = LLMEngine(EngineConfig(model=cfg.model, max_batch_size=1, prefix_caching=False), model=engine.model,
                      tokenizer=engine.tokenizer)
    decode: dict[int, dict[str, dict[str, float]]] = {}
    for streams in cfg.streams:
        samples: dict[str, tuple[list[float], list[float]]] = {name: ([], []) for name in CONFIGS}
        for rnd in range(cfg.rounds + 1):  # round 0 warms up (compiles the grammar, fills caches)
            for name, fields in CONFIGS.items():
                times, proc = _decode_steps(engine, streams, cfg.steps, fields)
                if rnd:
                    samples[name][0].extend(times)
                    samples[name][1].extend(proc)
        base = statistics.median(samples["free"][0])
        decode[streams] = {name: {"step_ms": statistics.median(t) * 1e3, "processing_ms": statistics.median(p) * 1e3,
                                  "ratio": statistics.median(t) / base} for name, (t, p) in samples.items()}
        log(f"[api] {streams} streams: " + ", ".join(f"{n} {v['step_ms']:.1f} ms" for n, v in decode[streams].items()))
    prefix: dict[str, list[float]] = {"first": [], "repeat": [], "no_cache_repeat": []}
    for rnd in range(cfg.rounds):
        system = _system_prompt(engine, cfg.system_tokens, rnd)
        prefix["first"].append(_ttft(engine, system, "Which shelf holds atlases?"))
        prefix["repeat"].append(_ttft(engine, system, "Which shelf holds poetry?"))
        _ttft(plain, system, "Which shelf holds atlases?")
        prefix["no_cache_repeat"].append(_ttft(plain, system, "Which shelf holds poetry?"))
    prompt_tokens = len(engine.tokenizer.encode(_system_prompt(engine, cfg.system_tokens, 0), add_special_tokens=False))
    summary = {k: statistics.median(v) for k, v in prefix.items()}
    return {"decode": decode, "prefix": {**summary, "ratio": summary["repeat"] / summary["first"],
                                         "system_tokens": prompt_tokens,
                                         "cached_tokens": engine.scheduler.cached_tokens}}


def format_summary(cfg: ApiBenchConfig, result: dict) -> str:
    lines = [f"# decode step, median of {cfg.rounds} x {cfg.steps} steps (target: json_schema <= 1.10x free)",
             "streams  config        step ms  ratio  logits processing ms"]
    for streams, rows in result["decode"].items():
        for name, v in rows.items():
            lines.append(f"{streams:7d}  {name:12s} {v['step_ms']:8.2f}  {v['ratio']:5.2f}  {v['processing_ms']:8.3f}")
    p = result["prefix"]
    lines += [f"# time to first token, ~{p['system_tokens']}-token system prompt, median of {cfg.rounds} "
              "(target: repeat <= 0.3x first)",
              f"first {p['first'] * 1e3:.0f} ms, repeat {p['repeat'] * 1e3:.0f} ms ({p['ratio']:.2f}x), "
              f"repeat without prefix caching {p['no_cache_repeat'] * 1e3:.0f} ms"]
    return "\n".join(lines)
