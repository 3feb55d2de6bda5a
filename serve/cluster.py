"""What the replicas of one deployment tell each other, so /metrics and /health speak for all of them.

Behind Ray Serve's proxy (serve/ray_serve.py) any replica may answer a scrape. Each replica posts a
ReplicaReport to a board every PUBLISH_EVERY_S and whenever it answers /metrics or /health; the board
answers with every replica's last report. Counters add up over every replica that ever reported (a
replica that died keeps its share, so totals never go down while the board lives); gauges and the
replica list count the live ones, whose last report is under LIVE_WITHIN_S old. A single-process
server renders the same way from its own report alone. Nothing here imports Ray.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from pipelines.engine_types import EngineLoad
from serve.metrics import MetricsSnapshot

PUBLISH_EVERY_S = 1.0
LIVE_WITHIN_S = 5.0


@dataclass(frozen=True)
class ReplicaReport:
    """One replica's state.

    Attributes:
        replica: Its id.
        metrics: Its counters.
        load: Its engine's queue and cache (None while the model loads).
        in_flight: Sequences admitted and not finished.
        engine_alive: Whether its engine thread runs.
        heartbeat_age_s: Seconds since its engine loop last turned.
        pid: Its process id (on its node).
    """

    replica: str
    metrics: MetricsSnapshot
    load: EngineLoad | None
    in_flight: int
    engine_alive: bool
    heartbeat_age_s: float
    pid: int = 0

    def health(self) -> dict:
        return {"alive": self.engine_alive, "heartbeat_age_s": round(self.heartbeat_age_s, 3),
                "requests_in_flight": self.in_flight}


@dataclass(frozen=True)
class Peer:
    """A report as the board holds it: how old it is and whether its replica counts as live."""

    report: ReplicaReport
    age_s: float

    @property
    def live(self) -> bool:
        return self.age_s < LIVE_WITHIN_S


class Cluster(Protocol):
    """The board as one replica sees it."""

    replica: str  # this replica's id
    target: int   # replicas the deployment asks for

    async def exchange(self, own: ReplicaReport) -> list[Peer]:
        """Posts this replica's report; returns every replica's last one (this one's included)."""
        ...


class ReportBoard:
    """The board itself (held by one process: a Ray Serve deployment in serve/ray_serve.py)."""

    def __init__(self) -> None:
        self._reports: dict[str, tuple[float, ReplicaReport]] = {}  # replica -> (time posted, report)

    def put(self, report: ReplicaReport, now: float) -> list[Peer]:
        self._reports[report.replica] = (now, report)
        return [Peer(r, max(0.0, now - t)) for t, r in self._reports.values()]


def total_metrics(peers: list[Peer]) -> MetricsSnapshot:
    return sum((p.report.metrics for p in peers), MetricsSnapshot())


def gauges(reports: list[ReplicaReport]) -> dict[str, float]:
    """The gauges of /metrics, summed over the given (live) replicas; ready when any of them is."""
    loads = [r.load for r in reports if r.load is not None]
    out: dict[str, float] = {"crucible_ready": 1.0 if loads else 0.0}
    if loads:
        used, total = sum(x.pages_used for x in loads), sum(x.pages_total for x in loads)
        out.update({
            "crucible_requests_in_flight": sum(r.in_flight for r in reports),
            "crucible_queue_depth": sum(x.waiting for x in loads),
            "crucible_running_requests": sum(x.running for x in loads),
            "crucible_kv_cache_pages_used": used,
            "crucible_kv_cache_pages_total": total,
            "crucible_kv_cache_usage_ratio": used / max(1, total),
            "crucible_prefix_cache_hit_tokens": sum(x.cached_tokens for x in loads),
            "crucible_preemptions": sum(x.preemptions for x in loads),
        })
    return out


def replicas_health(peers: list[Peer], target: int) -> dict:
    """The "replicas" block of /health: how many the deployment asks for, how many report, and each one."""
    members = [{"replica": p.report.replica, "pid": p.report.pid, "live": p.live, "report_age_s": round(p.age_s, 3),
                "engine": p.report.health()} for p in sorted(peers, key=lambda p: p.report.replica)]
    return {"target": target, "live": sum(p.live for p in peers),
            "members": [m for m in members if m["live"]]}
