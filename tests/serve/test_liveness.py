"""Liveness is real: when the engine thread dies, waiting requests get an error, /health answers 503
at once, new requests get 503, and the server is told to stop with status 1 (in-process, on the tiny
model); run_server turns that into the process's exit status after one line on stderr."""

from __future__ import annotations

import contextlib
import time

import pytest
from fastapi.testclient import TestClient

from serve.app import ServerConfig, create_app


def _app(engine):
    app = create_app(ServerConfig(model=str(engine.model.source.path)), load_in_background=False, engine=engine)
    return app, app.state.crucible


def test_a_dead_engine_thread_is_reported_and_stops_the_server(make_engine, monkeypatch) -> None:
    engine = make_engine(max_batch_size=4)
    app, state = _app(engine)
    stops: list[float] = []
    state.on_fatal = lambda: stops.append(time.time())
    body = {"model": engine.model.source.path.name, "prompt": "hi", "max_tokens": 3}
    with TestClient(app) as client:
        assert client.post("/v1/completions", json=body).status_code == 200
        health = client.get("/health").json()
        assert health["status"] == "ok" and health["engine"]["alive"] is True

        def broken_step():
            raise SystemError("planted engine bug")

        monkeypatch.setattr(engine, "step", broken_step)
        r = client.post("/v1/completions", json=body)  # waiting when the thread dies: an error, not a hang
        died = time.time()
        assert r.status_code == 500 and "engine stopped" in r.json()["error"]["message"]
        h = client.get("/health")
        assert h.status_code == 503 and time.time() - died < 1.0
        assert h.json()["engine"]["alive"] is False and "planted engine bug" in h.json()["error"]
        r = client.post("/v1/chat/completions", json={"model": body["model"], "messages": [
            {"role": "user", "content": "hi"}]})
        assert r.status_code == 503 and r.json()["error"]["code"] == "engine_stopped"
    assert stops and state.fatal[0] == 1 and "planted engine bug" in state.fatal[1]


def test_run_server_exits_with_the_failure_status(monkeypatch, capsys: pytest.CaptureFixture[str]) -> None:
    from fastapi import FastAPI

    from crucible.core.proc import free_port
    from serve import server
    from serve.app import ServerState

    def fake_app(config: ServerConfig) -> FastAPI:
        state = ServerState(config)

        @contextlib.asynccontextmanager
        async def lifespan(app: FastAPI):
            state.stop_with(3, "planted failure")
            yield

        app = FastAPI(lifespan=lifespan)
        app.state.crucible = state
        return app

    monkeypatch.setattr(server, "create_app", fake_app)
    start = time.time()
    assert server.run_server(ServerConfig(), port=free_port()) == 3
    assert time.time() - start < 10
    assert capsys.readouterr().err.strip().splitlines()[-1] == "crucible serve: error: planted failure"


def test_an_unloadable_model_stops_serve_with_one_line(tiny_models, tmp_path) -> None:
    import subprocess
    import sys

    from crucible.core.proc import child_env, free_port

    data = tiny_models["llama"].gguf["Q4_0"].read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[: len(data) // 2])  # a download that stopped halfway
    proc = subprocess.run([sys.executable, "-m", "crucible.cli", "serve", "--model", str(cut), "--port",
                           str(free_port())], capture_output=True, text=True, timeout=300,
                          env=child_env({"CRUCIBLE_DEBUG": ""}))
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"crucible serve: error: cannot load model '{cut}'") and "Traceback" not in proc.stderr


def test_one_model_route(make_engine) -> None:
    engine = make_engine(max_batch_size=4)
    app, _ = _app(engine)
    name = engine.model.source.path.name
    with TestClient(app) as client:
        r = client.get(f"/v1/models/{name}")
        assert r.status_code == 200 and r.json()["id"] == name and r.json()["object"] == "model"
        missing = client.get("/v1/models/gpt-4o")
        assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"


def test_metrics_label_routes_not_paths(make_engine) -> None:
    """A made-up path with a quote and a newline once wrote a label that broke every later scrape, and
    each new path added a series: the counter is labelled by the matched route, or "unmatched"."""
    import re

    app, _ = _app(make_engine(max_batch_size=4))
    with TestClient(app) as client:
        client.get("/v1/models/anything-at-all")
        for i in range(5):
            assert client.get(f"/v1/a%22b%0A%7Dfake_metric%201/{i}").status_code == 404  # a"b\n}fake_metric 1
        text = client.get("/metrics").text
    counters = [ln for ln in text.splitlines() if ln.startswith("crucible_requests_total{")]
    assert not any(ln.startswith("fake_metric") for ln in text.splitlines())
    assert all(re.fullmatch(r'crucible_requests_total\{route="(/v1/[^"\\\n]*|unmatched)",status="\d+"\} \d+', ln)
               for ln in counters), counters
    assert 'crucible_requests_total{route="unmatched",status="404"} 5' in counters
    assert 'crucible_requests_total{route="/v1/models/{model_id:path}",status="404"} 1' in counters
    parser = pytest.importorskip("prometheus_client.parser")
    assert {f.name for f in parser.text_string_to_metric_families(text)} >= {"crucible_requests"}


def test_unknown_routes_and_methods_get_openai_shaped_errors(make_engine) -> None:
    app, _ = _app(make_engine(max_batch_size=4))
    with TestClient(app) as client:
        missing = client.post("/v1/embeddings", json={"input": "x"})
        wrong = client.get("/v1/chat/completions")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "unknown_url"
    assert "/v1/embeddings" in missing.json()["error"]["message"]
    assert wrong.status_code == 405 and wrong.json()["error"]["code"] == "method_not_allowed"
    assert "POST" in wrong.headers["allow"]
