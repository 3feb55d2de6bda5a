"""Prometheus text exposition of the server's counters and gauges (no client library needed).

A server behind Ray Serve has one Metrics per replica; /metrics sums their snapshots (serve/cluster.py),
so a scrape through the proxy sees the whole deployment whichever replica answers.
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass, field

TTFT_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


@dataclass(frozen=True)
class MetricsSnapshot:
    """The counters at one moment; snapshots of several replicas add up."""

    requests: dict[tuple[str, int], int] = field(default_factory=dict)  # (route, status) -> count
    prompt_tokens: int = 0
    completion_tokens: int = 0
    ttft_buckets: tuple[int, ...] = (0,) * (len(TTFT_BUCKETS) + 1)
    ttft_sum: float = 0.0
    ttft_count: int = 0

    def __add__(self, other: MetricsSnapshot) -> MetricsSnapshot:
        return MetricsSnapshot(dict(Counter(self.requests) + Counter(other.requests)),
                               self.prompt_tokens + other.prompt_tokens,
                               self.completion_tokens + other.completion_tokens,
                               tuple(a + b for a, b in zip(self.ttft_buckets, other.ttft_buckets)),
                               self.ttft_sum + other.ttft_sum, self.ttft_count + other.ttft_count)


@dataclass
class Metrics:
    """Thread-safe counters of one server process."""

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

    def snapshot(self) -> MetricsSnapshot:
        with self._lock:
            return MetricsSnapshot(dict(self.requests), self.prompt_tokens, self.completion_tokens,
                                   tuple(self.ttft_buckets), self.ttft_sum, self.ttft_count)


def _label(value: str) -> str:
    """A label value escaped as the Prometheus text format asks (backslash, quote, newline)."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def render(snap: MetricsSnapshot, gauges: dict[str, float]) -> str:
    """The Prometheus text of counters and gauges."""
    lines = ["# TYPE crucible_requests_total counter"]
    for (route, status), n in sorted(snap.requests.items()):
        lines.append(f'crucible_requests_total{{route="{_label(route)}",status="{status}"}} {n}')
    lines += ["# TYPE crucible_prompt_tokens_total counter", f"crucible_prompt_tokens_total {snap.prompt_tokens}",
              "# TYPE crucible_completion_tokens_total counter",
              f"crucible_completion_tokens_total {snap.completion_tokens}",
              "# TYPE crucible_time_to_first_token_seconds histogram"]
    cum = 0
    for b, n in zip((*TTFT_BUCKETS, float("inf")), snap.ttft_buckets):
        cum += n
        le = "+Inf" if b == float("inf") else f"{b}"
        lines.append(f'crucible_time_to_first_token_seconds_bucket{{le="{le}"}} {cum}')
    lines += [f"crucible_time_to_first_token_seconds_sum {snap.ttft_sum:.6f}",
              f"crucible_time_to_first_token_seconds_count {snap.ttft_count}"]
    for name, value in gauges.items():
        lines += [f"# TYPE {name} gauge", f"{name} {value}"]
    return "\n".join(lines) + "\n"
