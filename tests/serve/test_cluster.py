"""serve/cluster.py without Ray: the report board's liveness, and /metrics summed over replicas."""

from __future__ import annotations

from pipelines.engine_types import EngineLoad
from serve.cluster import LIVE_WITHIN_S, Peer, ReportBoard, ReplicaReport, gauges, replicas_health, total_metrics
from serve.metrics import Metrics, MetricsSnapshot, render


def _report(name: str, completions: int, load: EngineLoad | None = EngineLoad(1, 2, 3, 100, 7)) -> ReplicaReport:
    m = Metrics()
    for _ in range(completions):
        m.request("/v1/completions", 200)
        m.tokens(5, 3)
        m.ttft(0.2)
    m.request("/v1/models", 401)
    return ReplicaReport(name, m.snapshot(), load, in_flight=2, engine_alive=True, heartbeat_age_s=0.1)


def test_counters_add_over_every_replica_and_gauges_over_the_live_ones() -> None:
    board = ReportBoard()
    board.put(_report("a", 3), now=0.0)
    board.put(_report("b", 4), now=0.5)
    peers = board.put(_report("a", 5), now=1.0)  # a posts again: its newer counters replace its older ones
    total = total_metrics(peers)
    assert total.requests == {("/v1/completions", 200): 9, ("/v1/models", 401): 2}
    assert (total.prompt_tokens, total.completion_tokens, total.ttft_count) == (45, 27, 9)
    assert sum(total.ttft_buckets) == 9
    g = gauges([p.report for p in peers if p.live])
    assert g["crucible_kv_cache_pages_total"] == 200 and g["crucible_requests_in_flight"] == 4
    assert g["crucible_kv_cache_usage_ratio"] == 6 / 200 and g["crucible_ready"] == 1.0

    # b goes quiet: its counters stay in the sum (totals never go down), its gauges and membership leave.
    later = board.put(_report("a", 6), now=0.5 + LIVE_WITHIN_S + 0.1)
    assert total_metrics(later).requests[("/v1/completions", 200)] == 10
    live = [p.report for p in later if p.live]
    assert [r.replica for r in live] == ["a"] and gauges(live)["crucible_kv_cache_pages_total"] == 100
    health = replicas_health(later, target=2)
    assert health["target"] == 2 and health["live"] == 1 and [m["replica"] for m in health["members"]] == ["a"]


def test_one_process_renders_as_before_and_a_loading_one_is_not_ready() -> None:
    r = _report("local", 2)
    text = render(total_metrics([Peer(r, 0.0)]), gauges([r]))
    assert 'crucible_requests_total{route="/v1/completions",status="200"} 2' in text
    assert 'crucible_time_to_first_token_seconds_bucket{le="0.25"} 2' in text
    assert "crucible_ready 1.0" in text and "crucible_queue_depth 1" in text
    assert gauges([_report("local", 0, load=None)]) == {"crucible_ready": 0.0}
    assert MetricsSnapshot() + MetricsSnapshot() == MetricsSnapshot()

