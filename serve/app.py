"""The OpenAI-compatible HTTP API (FastAPI) over the Crucible engine.

Routes: POST /v1/chat/completions, POST /v1/completions (streaming or not), GET /v1/models,
GET /health (200 while the engine runs; 503 while the model loads or once the engine has stopped),
GET /metrics (Prometheus text).
Behind Ray Serve (serve/ray_serve.py) every replica runs this app; given a `cluster`, /metrics sums the
replicas' counters and /health lists them (serve/cluster.py).
A model that fails to load, or an engine thread that dies, stops the server with a non-zero status
(`ServerState.fatal`, read by serve/server.py) after one line on stderr, so a supervisor restarts it.
Every generation response carries `system_fingerprint` and an `X-Crucible-Kernels` header naming the
kernel build, the device and any hot-path fallback to a MAX built-in.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from jinja2 import TemplateError
from starlette.exceptions import HTTPException as StarletteHTTPException

from crucible.core.registry import DEFAULT_MODEL
from crucible.core.tokenizer import TokenBytes
from crucible.core.errors import INTERNAL_ERROR, debug, debug_hint, exit_status, one_line
from pipelines.grammar import GrammarError
from pipelines.request import Request as EngineRequest
from serve.engine_bridge import EngineBridge, EngineDead, QueueFull
from pipelines.scheduler import DEFAULT_CPU_BATCH
from serve.cluster import PUBLISH_EVERY_S, Cluster, Peer, ReplicaReport, gauges, replicas_health, total_metrics
from serve.metrics import Metrics, render
from serve.choices import Choice, choice_object, stream_delta
from serve.protocol import APIError, envelope, new_id, parse_request, usage


# How often a handler waiting on the engine checks that its client is still there; a gone client's
# sequences are aborted. 499 (nginx's "client closed request") is what the access log then shows.
DISCONNECT_POLL_S = 1.0
CLIENT_CLOSED = 499


@dataclass(frozen=True)
class ServerConfig:
    """Server settings.

    Attributes:
        model: Registry name, .gguf file or HF folder.
        served_name: The model id clients use (default: the registry name or the file/folder name).
        device: "cpu" or "gpu".
        max_batch_size: Requests decoded together.
        max_in_flight: Requests admitted at once before 429.
        max_body_bytes: Largest request body before 413.
        api_key: When set, /v1/* needs "Authorization: Bearer <key>".
        kv_cache_gib: KV cache memory.
        activations: "f32" or "q8" (int8 activations in the CPU decode matmuls).
        prefix_caching: Reuse the KV pages of cached prompt prefixes.
        dtype: The graph's compute dtype ("auto", "float32" or "bfloat16").
    """

    model: str = DEFAULT_MODEL
    served_name: str | None = None
    device: str = "cpu"
    max_batch_size: int = DEFAULT_CPU_BATCH
    max_in_flight: int = 256
    max_body_bytes: int = 1 << 20
    api_key: str | None = None
    kv_cache_gib: float = 1.0
    activations: str = "f32"
    prefix_caching: bool = True
    dtype: str = "auto"


@dataclass
class ServerState:
    config: ServerConfig
    metrics: Metrics = field(default_factory=Metrics)
    bridge: EngineBridge | None = None
    model_name: str = ""
    fingerprint: str = ""
    kernels_header: str = ""
    load_error: str | None = None
    started: float = field(default_factory=time.time)
    fatal: tuple[int, str] | None = None           # (exit status, message) that stops the server
    on_fatal: Callable[[], None] | None = None     # set by the runner: begins the shutdown
    cluster: Cluster | None = None                  # the other replicas, behind Ray Serve
    token_bytes: TokenBytes | None = None           # the served tokenizer's token -> bytes (logprobs)

    def report(self) -> ReplicaReport:
        """This server's counters and engine state, as /metrics and /health render them."""
        bridge = self.bridge
        return ReplicaReport(self.cluster.replica if self.cluster else "local", self.metrics.snapshot(),
                             bridge.engine.load() if bridge else None, bridge.in_flight if bridge else 0,
                             bridge is not None and bridge.alive,
                             time.time() - bridge.heartbeat if bridge else 0.0, os.getpid())

    async def peers(self) -> list[Peer]:
        """Every replica's last report (just this one's outside a cluster, or while the board is away)."""
        own = self.report()
        if self.cluster is not None:
            try:
                return await self.cluster.exchange(own)
            except Exception as exc:  # noqa: BLE001 - the board restarting: speak for this replica alone
                print(f"[crucible] replica {own.replica}: cannot reach the report board: {one_line(exc)}",
                      file=sys.stderr)
        return [Peer(own, 0.0)]

    @property
    def ready(self) -> bool:
        return self.bridge is not None

    @property
    def engine_alive(self) -> bool:
        return self.bridge is not None and self.bridge.alive

    def stop_with(self, status: int, message: str) -> None:
        """Records why the server must stop and asks the runner to stop it (first cause wins)."""
        if self.fatal is None:
            self.fatal = (status, message)
        if self.on_fatal is not None:
            self.on_fatal()


def make_engine(cfg: ServerConfig):
    """The engine that serves cfg.model (loads and compiles the model)."""
    from pipelines.engine import EngineConfig, LLMEngine

    return LLMEngine(EngineConfig(model=cfg.model, device=cfg.device, max_batch_size=cfg.max_batch_size,
                                  max_step_tokens=max(512, cfg.max_batch_size), kv_cache_gib=cfg.kv_cache_gib,
                                  activations=cfg.activations, prefix_caching=cfg.prefix_caching,
                                  dtype=cfg.dtype))


def _load(state: ServerState, engine=None) -> None:
    """Loads the model and starts the engine thread (runs in a background thread at startup)."""
    try:
        from pathlib import Path

        from max._mlir_context import ensure_default_mlir_context

        cfg = state.config
        if engine is None:
            # MAX's MLIR context is thread-local: enter it in this loader thread to build graphs here.
            with ensure_default_mlir_context():
                engine = make_engine(cfg)
        prov = engine.model.provenance
        name = cfg.served_name or (Path(cfg.model).name if Path(cfg.model).exists() else cfg.model)
        fallbacks = ",".join(prov["hot_path_fallbacks"]) or "none"
        state.model_name = name
        act = "" if prov["activations"] == "f32" else f"-{prov['activations']}"
        dt = "" if prov["dtype"] == "float32" else f"-{prov['dtype']}"
        state.fingerprint = f"crucible-{prov['kernel_build']}-{prov['device']}{dt}{act}"
        state.kernels_header = (f"build={prov['kernel_build']}; device={prov['device']}; dtype={prov['dtype']}; ops=crucible; "
                                f"activations={prov['activations']}; fallbacks={fallbacks}")
        print(f"[crucible] {engine.model.load_line()}", file=sys.stderr)
        state.token_bytes = TokenBytes(engine.tokenizer)
        state.bridge = EngineBridge(engine, cfg.max_in_flight, on_death=lambda exc: state.stop_with(
            INTERNAL_ERROR, f"the engine thread stopped: {type(exc).__name__}: {one_line(exc)}"))
    except Exception as exc:  # noqa: BLE001 - reported on stderr and by /health, then the server stops
        if debug():
            traceback.print_exception(exc)
        state.load_error = f"{type(exc).__name__}: {one_line(exc)}"
        status = exit_status(exc)
        state.stop_with(status, f"cannot load model '{state.config.model}': {state.load_error}{debug_hint(status)}")


def create_app(config: ServerConfig, load_in_background: bool = True, engine=None,
               cluster: Cluster | None = None) -> FastAPI:
    """Builds the app; the model loads in a background thread so /health answers during loading.

    Args:
        config: Settings.
        load_in_background: Load at startup in a thread (else before the first request is taken).
        engine: An LLMEngine to serve instead of building one from config.model (tests reuse one).
        cluster: The deployment's report board when this app is one replica of several.
    """
    state = ServerState(config, cluster=cluster)

    async def publish() -> None:
        while True:
            await state.peers()
            await asyncio.sleep(PUBLISH_EVERY_S)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        if load_in_background:
            threading.Thread(target=_load, args=(state, engine), daemon=True).start()
        else:
            _load(state, engine)
        publisher = asyncio.create_task(publish()) if cluster is not None else None
        yield
        if publisher is not None:
            publisher.cancel()
        if state.bridge is not None:
            state.bridge.shutdown()

    app = FastAPI(title="Crucible", docs_url=None, redoc_url=None, lifespan=lifespan)
    app.state.crucible = state

    def error_response(err: APIError) -> JSONResponse:
        return JSONResponse(err.body(), status_code=err.status, headers=err.headers)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        # An unknown route or method gets an OpenAI-shaped error, not FastAPI's {"detail": ...}.
        code = {404: "unknown_url", 405: "method_not_allowed"}.get(exc.status_code)
        message = (f"unknown URL: {request.method} {request.url.path}" if exc.status_code == 404 else
                   f"method {request.method} is not allowed on {request.url.path}" if exc.status_code == 405
                   else str(exc.detail))
        return error_response(APIError(exc.status_code, message, code=code, headers=exc.headers))

    @app.middleware("http")
    async def guard(request: Request, call_next):
        path = request.url.path
        try:
            if path.startswith("/v1/"):
                if config.api_key and request.headers.get("authorization") != f"Bearer {config.api_key}":
                    raise APIError(401, "invalid or missing API key (Authorization: Bearer <key>)",
                                   code="invalid_api_key")
                length = request.headers.get("content-length")
                if length is not None and int(length) > config.max_body_bytes:
                    raise APIError(413, f"request body over {config.max_body_bytes} bytes", code="body_too_large")
                if not state.ready:
                    raise APIError(503, "the model is still loading" if state.load_error is None
                                   else "the model failed to load", code="model_not_ready", type_="server_error",
                                   headers={"Retry-After": "2"})
                if not state.engine_alive:
                    raise APIError(503, "the engine has stopped; the server is shutting down",
                                   code="engine_stopped", type_="server_error")
            response = await call_next(request)
        except APIError as err:
            response = error_response(err)
        except Exception as exc:  # noqa: BLE001 - never leak a stack trace as a 500 body
            response = error_response(APIError(500, f"internal error: {exc}", type_="server_error"))
        if path.startswith("/v1/"):
            state.metrics.request(route_of(path), response.status_code)
        return response

    def route_of(path: str) -> str:
        """The route template a path matches ("/v1/models/{model_id:path}"), else "unmatched": the
        requests counter is labelled by route, so a client cannot add series by inventing paths."""
        for route in app.routes:
            regex = getattr(route, "path_regex", None)
            if regex is not None and regex.match(path):
                return route.path
        return "unmatched"

    async def read_json(request: Request) -> object:
        body = await request.body()
        if len(body) > config.max_body_bytes:
            raise APIError(413, f"request body over {config.max_body_bytes} bytes", code="body_too_large")
        try:
            return json.loads(body)
        except (ValueError, UnicodeDecodeError) as exc:  # JSONDecodeError is a ValueError
            raise APIError(400, f"malformed JSON body: {exc}", code="invalid_json") from exc
        except RecursionError:
            raise APIError(400, "malformed JSON body: nested too deeply", code="invalid_json") from None

    async def generate(request: Request, kind: str) -> Response:
        from pipelines.openai_request import prompt_jobs

        bridge = state.bridge
        engine = bridge.engine
        req = parse_request(await read_json(request), kind, engine.max_seq_len)
        if req.model not in (state.model_name, config.model):
            raise APIError(404, f"the model '{req.model}' does not exist; this server serves '{state.model_name}'",
                           param="model", code="model_not_found")
        tok = engine.tokenizer
        n_seqs = req.params.n * (1 if kind == "chat" else len(req.prompts))
        if n_seqs > config.max_in_flight:  # could never be admitted: 429 would have the client retry forever
            raise APIError(400, f"n x prompts = {n_seqs} sequences, more than this server runs at once "
                                f"({config.max_in_flight})", param="n", code="invalid_value")
        try:
            # Off the event loop: tokenizing many prompts, or a first grammar (llguidance builds its view of
            # the vocabulary), takes long enough to stall every stream.
            jobs = await asyncio.to_thread(prompt_jobs, tok, req, engine.max_seq_len)
            # The jobs' grammar (prompt_jobs may name the tool tags as this tokenizer's tokens), after
            # response_format's alone, so that an error names the field that holds the schema.
            for param, grammar in (("response_format", req.answer), ("tools", jobs[0][1].grammar if jobs else None)):
                if grammar is not None:
                    try:
                        await asyncio.to_thread(engine.grammars.compile, grammar)
                    except GrammarError as exc:
                        raise APIError(400, f"unsupported {param}: {exc}", param=param,
                                       code="unsupported_schema") from exc
        except (ValueError, TypeError, TemplateError) as exc:  # e.g. a chat template that refuses the roles' order
            raise APIError(400, f"cannot build the prompt: {one_line(exc)}", param="messages" if kind == "chat"
                           else "prompt") from exc
        rid = new_id(kind)
        choices, queue = _submit(req, jobs, rid)
        headers = {"X-Crucible-Kernels": state.kernels_header}

        def token_text(token_id: int) -> str:
            return tok.decode([token_id])

        raw = state.token_bytes

        def decode(ids: list[int]) -> str:
            return tok.decode(ids, skip_special_tokens=True)

        def abort_unfinished() -> None:  # cancelled, or the client left: stop and free the KV pages
            for c in choices.values():
                if c.engine_req.finish_reason is None:
                    bridge.abort(c.request_id)

        if req.stream:
            return _AbortingStream(_stream(request, req, rid, choices, queue, token_text, decode, raw), abort_unfinished,
                                   media_type="text/event-stream", headers=headers)
        try:
            delivered = await _gather(request, choices, queue)
        except asyncio.CancelledError:
            abort_unfinished()
            raise
        if not delivered:
            abort_unfinished()
            return Response(status_code=CLIENT_CLOSED)
        failed = next((c.choice.last for c in choices.values() if c.choice.last.finish_reason == "error"), None)
        if failed is not None:
            raise APIError(500, failed.error or "generation failed", type_="server_error")
        for c in choices.values():
            _record(c)
        body = envelope(req, rid, state.model_name, state.fingerprint,
                        [choice_object(req, c.choice, token_text, decode, raw) for c in choices.values()])
        body["usage"] = _usage(choices)
        return JSONResponse(body, headers=headers)

    def _submit(req, jobs: list, rid: str) -> tuple[dict[str, _Seq], asyncio.Queue]:
        """Submits every prompt's n sequences; on any failure the ones already submitted are aborted."""
        from pipelines.engine import ContextLengthError

        bridge = state.bridge
        seqs: dict[str, _Seq] = {}
        queue: asyncio.Queue = asyncio.Queue()
        try:
            for p, (ids, params) in enumerate(jobs):
                sub_id = rid if len(jobs) == 1 else f"{rid}-p{p}"
                engine_reqs, _ = bridge.submit(ids, params, request_id=sub_id, queue=queue)
                for r in engine_reqs:
                    seqs[r.request_id] = _Seq(r, Choice(p * params.n + r.index, ids))
        except BaseException as exc:
            for s in seqs.values():
                bridge.abort(s.request_id)
            if isinstance(exc, ContextLengthError):
                param = ("messages" if req.kind == "chat" else "prompt") if exc.prompt_alone else "max_tokens"
                raise APIError(400, str(exc), param=param, code="context_length_exceeded") from exc
            if isinstance(exc, EngineDead):
                raise APIError(503, "the engine has stopped; the server is shutting down", code="engine_stopped",
                               type_="server_error") from None
            if isinstance(exc, QueueFull):
                raise APIError(429, "too many requests in flight; retry shortly", code="rate_limit_exceeded",
                               type_="rate_limit_error", headers={"Retry-After": "1"}) from None
            if isinstance(exc, ValueError):
                raise APIError(400, str(exc), param=getattr(exc, "param", None), code="invalid_value") from exc
            raise
        return seqs, queue

    async def _gather(request: Request, seqs: dict[str, _Seq], queue: asyncio.Queue) -> bool:
        """Feeds each sequence's outputs to its choice until every sequence has finished.

        Returns:
            True, or False once the client is found gone (checked every DISCONNECT_POLL_S: uvicorn
            does not cancel a handler whose client leaves).
        """
        pending = len(seqs)
        next_check = time.monotonic() + DISCONNECT_POLL_S
        while pending:
            try:
                async with asyncio.timeout(DISCONNECT_POLL_S):  # no task per output, as wait_for makes
                    out = await queue.get()
                seqs[out.request_id].choice.add(out)
                pending -= out.finished
            except TimeoutError:
                pass
            # Outputs may arrive faster than the timeout forever: check on a clock, not only when idle.
            if pending and time.monotonic() >= next_check:
                if await request.is_disconnected():
                    return False
                next_check = time.monotonic() + DISCONNECT_POLL_S
        return True

    def _usage(seqs: dict[str, _Seq]) -> dict:
        # Prompt tokens, and the cached ones, count once per prompt (its first sequence), as OpenAI bills n > 1.
        firsts = [s.engine_req for s in seqs.values() if s.engine_req.index == 0]
        return usage(sum(len(r.prompt_ids) for r in firsts), sum(len(s.engine_req.output_ids) for s in seqs.values()),
                     sum(r.cached_tokens for r in firsts))

    def _record(seq: _Seq) -> None:
        out, engine_req = seq.choice.last, seq.engine_req
        state.metrics.tokens(out.prompt_tokens if engine_req.index == 0 else 0, out.completion_tokens)
        if engine_req.first_token_time is not None:
            state.metrics.ttft(engine_req.first_token_time - engine_req.arrival)

    async def _stream(request: Request, req, rid: str, seqs: dict[str, _Seq], queue: asyncio.Queue,
                      token_text: Callable[[int], str], decode: Callable[[list[int]], str],
                      raw: Callable[[int], bytes]):
        bridge = state.bridge
        pending = set(seqs)

        def chunk(items: list[dict]) -> str:
            return _sse(envelope(req, rid, state.model_name, state.fingerprint, items, stream=True))

        try:
            first = [{"index": s.choice.index, "delta": {"role": "assistant", "content": ""}, "finish_reason": None,
                      "logprobs": None} if req.kind == "chat" else
                     {"index": s.choice.index, "text": "", "finish_reason": None, "logprobs": None}
                     for s in seqs.values()]
            yield chunk(first)
            while pending:
                try:
                    out = await asyncio.wait_for(queue.get(), timeout=DISCONNECT_POLL_S)
                except asyncio.TimeoutError:
                    if await request.is_disconnected():
                        return
                    continue
                seq = seqs[out.request_id]
                seq.choice.add(out)
                if out.finished:
                    pending.discard(out.request_id)
                    _record(seq)
                    if out.finish_reason == "error":
                        yield _sse({"error": {"message": out.error, "type": "server_error", "param": None,
                                              "code": None}})
                        return
                for item in stream_delta(req, seq.choice, out, token_text, decode, raw):
                    yield chunk([item])
            if req.include_usage:
                last = envelope(req, rid, state.model_name, state.fingerprint, [], stream=True)
                last["usage"] = _usage(seqs)
                yield _sse(last)
            yield "data: [DONE]\n\n"
        finally:
            # Client gone (or any exit before the end): stop the generation and free its KV pages.
            for rid_ in pending:
                bridge.abort(rid_)

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        try:
            return await generate(request, "chat")
        except APIError as err:
            return error_response(err)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        try:
            return await generate(request, "completion")
        except APIError as err:
            return error_response(err)

    def model_object() -> dict:
        return {"id": state.model_name, "object": "model", "created": int(state.started), "owned_by": "crucible"}

    @app.get("/v1/models")
    async def models() -> Response:
        return JSONResponse({"object": "list", "data": [model_object()]})

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str) -> Response:
        if model_id not in (state.model_name, config.model):
            return error_response(APIError(404, f"the model '{model_id}' does not exist; this server serves "
                                                f"'{state.model_name}'", param="model", code="model_not_found"))
        return JSONResponse(model_object())

    @app.get("/health")
    async def health() -> Response:
        if state.load_error is not None:
            return JSONResponse({"status": "error", "error": state.load_error}, status_code=500)
        if not state.ready:
            return JSONResponse({"status": "loading"}, status_code=503)
        bridge = state.bridge
        engine = {"alive": bridge.alive, "heartbeat_age_s": round(time.time() - bridge.heartbeat, 3),
                  "requests_in_flight": bridge.in_flight}
        if not bridge.alive:
            return JSONResponse({"status": "error", "error": f"the engine has stopped: {bridge.error!r}",
                                 "engine": engine}, status_code=503)
        body = {"status": "ok", "model": state.model_name, "kernels": state.kernels_header, "engine": engine}
        if state.cluster is not None:
            body["replica"] = state.cluster.replica
            body["replicas"] = replicas_health(await state.peers(), state.cluster.target)
        return JSONResponse(body)

    @app.get("/metrics")
    async def metrics() -> Response:
        peers = await state.peers()
        live = [p.report for p in peers if p.live]
        values = gauges(live)
        if state.cluster is not None:
            values.update({"crucible_replicas_target": state.cluster.target, "crucible_replicas_live": len(live)})
        return PlainTextResponse(render(total_metrics(peers), values), media_type="text/plain; version=0.0.4")

    return app


class _AbortingStream(StreamingResponse):
    """A stream whose unfinished sequences are aborted however the response ends. The body generator
    aborts them itself when it runs; this also covers a handler cancelled before its first chunk (Ray
    Serve cancels the request when the client leaves), which would leave them running to max_tokens."""

    def __init__(self, content, on_exit: Callable[[], None], **kwargs) -> None:
        super().__init__(content, **kwargs)
        self._on_exit = on_exit

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._on_exit()


@dataclass(frozen=True)
class _Seq:
    """One sequence of a response: the engine's request and the choice it fills."""

    engine_req: EngineRequest
    choice: Choice

    @property
    def request_id(self) -> str:
        return self.engine_req.request_id


def _sse(obj: dict) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"
