"""Runs the engine on one background thread and hands each request's outputs to asyncio.

HTTP handlers `submit` a request and read its outputs from an asyncio.Queue; `abort` stops it (used
when a client disconnects). A bounded admission count gives backpressure: past it, submit raises
QueueFull and the route answers 429.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from dataclasses import dataclass

from pipelines.engine import LLMEngine
from pipelines.request import Request, RequestOutput
from pipelines.sampling import SamplingParams


class QueueFull(Exception):
    """More requests in flight than the server admits."""


@dataclass
class _Stream:
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue


class EngineBridge:
    """Owns the engine thread.

    Args:
        engine: The engine (used only from the thread after start).
        max_in_flight: Requests admitted at once (running + waiting); the rest get 429.
    """

    def __init__(self, engine: LLMEngine, max_in_flight: int) -> None:
        self.engine = engine
        self.max_in_flight = max_in_flight
        self._streams: dict[str, _Stream] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = False
        self._thread = threading.Thread(target=self._loop, name="crucible-engine", daemon=True)
        self._thread.start()

    def submit(self, prompt_ids: Sequence[int], params: SamplingParams) -> tuple[Request, asyncio.Queue]:
        """Queues a request; returns it and the queue its RequestOutputs arrive on."""
        loop = asyncio.get_running_loop()
        with self._lock:
            if len(self._streams) >= self.max_in_flight:
                raise QueueFull
            req = self.engine.submit(prompt_ids, params)  # may raise ValueError (too long)
            queue: asyncio.Queue = asyncio.Queue()
            self._streams[req.request_id] = _Stream(loop, queue)
        self._wake.set()
        return req, queue

    def abort(self, request_id: str) -> None:
        self.engine.abort(request_id)
        self._wake.set()

    @property
    def in_flight(self) -> int:
        with self._lock:
            return len(self._streams)

    def shutdown(self) -> None:
        self._stop = True
        self._wake.set()
        self._thread.join(timeout=10)

    def _loop(self) -> None:
        while not self._stop:
            if not self.engine.has_work:
                self._wake.wait(timeout=0.5)
                self._wake.clear()
                continue
            for out in self.engine.step():
                self._deliver(out)

    def _deliver(self, out: RequestOutput) -> None:
        with self._lock:
            stream = self._streams.get(out.request_id)
            if stream is not None and out.finished:
                del self._streams[out.request_id]
        if stream is not None:
            stream.loop.call_soon_threadsafe(stream.queue.put_nowait, out)
