"""Prometheus text exposition of the server's counters and gauges (no client library needed)."""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass, field

TTFT_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


@dataclass
class Metrics:
    """Thread-safe counters; gauges are read from the engine when rendered."""

    requests: Counter = field(default_factory=Counter)      # (route, status) -> count
    prompt_tokens: int = 0
    completion_tokens: int = 0
    ttft_buckets: list[int] = field(default_factory=lambda: [0] * (len(TTFT_BUCKETS) + 1))
    ttft_sum: float = 0.0
    ttft_count: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def request(self, route: str, status: int) -> None:
        with self._lock:
            self.requests[(route, status)] += 1

    def tokens(self, prompt: int, completion: int) -> None:
        with self._lock:
            self.prompt_tokens += prompt
            self.completion_tokens += completion

    def ttft(self, seconds: float) -> None:
        with self._lock:
            i = next((i for i, b in enumerate(TTFT_BUCKETS) if seconds <= b), len(TTFT_BUCKETS))
            self.ttft_buckets[i] += 1
            self.ttft_sum += seconds
            self.ttft_count += 1

    def render(self, gauges: dict[str, float]) -> str:
        with self._lock:
            lines = ["# TYPE crucible_requests_total counter"]
            for (route, status), n in sorted(self.requests.items()):
                lines.append(f'crucible_requests_total{{route="{route}",status="{status}"}} {n}')
            lines += ["# TYPE crucible_prompt_tokens_total counter", f"crucible_prompt_tokens_total {self.prompt_tokens}",
                      "# TYPE crucible_completion_tokens_total counter",
                      f"crucible_completion_tokens_total {self.completion_tokens}",
                      "# TYPE crucible_time_to_first_token_seconds histogram"]
            cum = 0
            for b, n in zip((*TTFT_BUCKETS, float("inf")), self.ttft_buckets):
                cum += n
                le = "+Inf" if b == float("inf") else f"{b}"
                lines.append(f'crucible_time_to_first_token_seconds_bucket{{le="{le}"}} {cum}')
            lines += [f"crucible_time_to_first_token_seconds_sum {self.ttft_sum:.6f}",
                      f"crucible_time_to_first_token_seconds_count {self.ttft_count}"]
        for name, value in gauges.items():
            lines += [f"# TYPE {name} gauge", f"{name} {value}"]
        return "\n".join(lines) + "\n"
