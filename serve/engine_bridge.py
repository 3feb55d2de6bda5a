"""Runs the engine on one background thread and hands each request's outputs to asyncio.

HTTP handlers `submit` a request and read its outputs from an asyncio.Queue; `abort` stops it (used
when a client disconnects). A bounded admission count gives backpressure: past it, submit raises
QueueFull and the route answers 429.

The engine contains a failing request itself (pipelines/engine.py). If the thread dies anyway, every
waiting request gets an error output at once, later submits raise EngineDead, and `on_death` tells the
server, which reports 503 on /health and exits non-zero so that a supervisor restarts it.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pipelines.engine import LLMEngine
from pipelines.request import Request, RequestOutput
from pipelines.sampling import SamplingParams

log = logging.getLogger("crucible.serve")


class QueueFull(Exception):
    """More requests in flight than the server admits."""


class EngineDead(Exception):
    """The engine thread has stopped; no request can run."""


@dataclass
class _Stream:
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue


class EngineBridge:
    """Owns the engine thread.

    Args:
        engine: The engine (used only from the thread after start).
        max_in_flight: Requests admitted at once (running + waiting); the rest get 429.
        on_death: Called once, from the engine thread, with the exception that stopped it.
    """

    def __init__(self, engine: LLMEngine, max_in_flight: int,
                 on_death: Callable[[BaseException], None] | None = None) -> None:
        self.engine = engine
        self.max_in_flight = max_in_flight
        self.on_death = on_death
        self.error: BaseException | None = None  # what stopped the thread, once it has
        self.heartbeat = time.time()  # the loop's last turn: a step finished or an idle wait ended
        self._streams: dict[str, _Stream] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = False
        self._thread = threading.Thread(target=self._loop, name="crucible-engine", daemon=True)
        self._thread.start()

    def submit(self, prompt_ids: Sequence[int], params: SamplingParams,
               request_id: str | None = None,
               queue: asyncio.Queue | None = None) -> tuple[list[Request], asyncio.Queue]:
        """Queues a request's params.n sequences; returns them and the queue their RequestOutputs
        arrive on (one queue for all of them, or `queue` when given: a request with several prompts).

        Raises:
            QueueFull: Too many sequences in flight.
            EngineDead: The engine thread has stopped.
            ValueError: The request cannot run (too long, bad token ids, a grammar it cannot compile).
        """
        loop = asyncio.get_running_loop()
        queue = queue if queue is not None else asyncio.Queue()
        with self._lock:
            if not self.alive:
                raise EngineDead(f"the engine has stopped: {self.error!r}")
            if len(self._streams) + params.n > self.max_in_flight:
                raise QueueFull
            reqs = self.engine.submit_n(prompt_ids, params, request_id)
            for req in reqs:
                self._streams[req.request_id] = _Stream(loop, queue)
        self._wake.set()
        return reqs, queue

    def abort(self, request_id: str) -> None:
        self.engine.abort(request_id)
        self._wake.set()

    @property
    def alive(self) -> bool:
        """Whether the engine thread is running and has not failed."""
        return self.error is None and self._thread.is_alive()

    @property
    def in_flight(self) -> int:
        with self._lock:
            return len(self._streams)

    def shutdown(self) -> None:
        self._stop = True
        self._wake.set()
        self._thread.join(timeout=10)

    def _loop(self) -> None:
        try:
            while not self._stop:
                self.heartbeat = time.time()
                if not self.engine.has_work:
                    self._wake.wait(timeout=0.5)
                    self._wake.clear()
                    continue
                for out in self.engine.step():
                    self._deliver(out)
        except BaseException as exc:  # noqa: BLE001 - reported to every waiting client and the server
            log.critical("the engine thread stopped: %r", exc, exc_info=exc)
            self._die(exc)

    def _die(self, exc: BaseException) -> None:
        with self._lock:
            self.error = exc
            streams, self._streams = self._streams, {}
        for rid, stream in streams.items():
            out = RequestOutput(rid, (), "", True, "error", 0, 0, error=f"the engine stopped: {exc!r}")
            try:
                stream.loop.call_soon_threadsafe(stream.queue.put_nowait, out)
            except RuntimeError:  # that client's event loop is already closed
                pass
        if self.on_death is not None:
            self.on_death(exc)

    def _deliver(self, out: RequestOutput) -> None:
        with self._lock:
            stream = self._streams.get(out.request_id)
            if stream is not None and out.finished:
                del self._streams[out.request_id]
        if stream is not None:
            stream.loop.call_soon_threadsafe(stream.queue.put_nowait, out)
