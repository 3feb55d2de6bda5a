"""`crucible serve --ray [ADDRESS] --replicas N`: the OpenAI app of serve/app.py as N replicas behind
Ray Serve's HTTP proxy.

Each replica is one Ray Serve replica running the whole app over its own engine: the same routes,
errors, API key and body limits, since it is the same code. The proxy spreads requests over the
replicas (Serve's power-of-two-choices on queue length). What differs from one process:
- A replica loads its model in its constructor, so Serve sends it no request before it is ready; a model
  that cannot load fails the deployment, and the command exits with one line.
- Serve admits up to max_in_flight + ADMISSION_HEADROOM requests into a replica, so a full replica still
  answers 429 itself (its admission counts sequences, n included) rather than the proxy queueing.
- A replica whose engine stopped answers 503 and fails Serve's health check, and Serve replaces it;
  the others keep serving.
- /metrics and /health speak for every replica through a report board, a one-replica deployment of
  its own (serve/cluster.py); /health adds "replica" (who answered) and "replicas".
Ray is imported only here, and only `crucible serve --ray` imports this module.
"""

from __future__ import annotations

import asyncio
import re
import signal
import sys
import time
from dataclasses import dataclass

from ray import serve

from crucible.core.errors import INTERNAL_ERROR, exit_status, one_line
from pipelines.ray_batch import forwarded_env
from serve.app import ServerConfig, create_app, make_engine
from serve.cluster import Peer, ReplicaReport, ReportBoard

APP_NAME = "crucible"
ADMISSION_HEADROOM = 8  # /health, /metrics and refused requests beside a full replica's admitted ones
HEALTH_CHECK_PERIOD_S = 5.0
LOAD_ERROR = "crucible-load-error"  # tags a replica's load failure in Serve's status, for the driver


@dataclass(frozen=True)
class RayServeConfig:
    """Where and how many replicas run.

    Attributes:
        address: A running cluster ("auto", "ray://host:10001") or None for a local one on this machine.
        replicas: Serve replicas, each with one loaded model.
        cpus_per_replica: CPUs Ray reserves for each (a CPU replica's MAX runtime uses every core of its
            node: MAX 26.7 takes no thread count, so on CPUs one replica per node is the efficient layout).
        gpus_per_replica: GPUs per replica (0 on CPU).
        local_cpus: CPUs of the local cluster when address is None (None: all of this machine's).
    """

    address: str | None = None
    replicas: int = 1
    cpus_per_replica: float = 1.0
    gpus_per_replica: float = 0.0
    local_cpus: int | None = None

    def __post_init__(self) -> None:
        if self.replicas < 1:
            raise ValueError("replicas must be >= 1")
        if self.cpus_per_replica <= 0 or self.gpus_per_replica < 0:
            raise ValueError("cpus_per_replica must be > 0 and gpus_per_replica >= 0")


@serve.deployment(name="reports", num_replicas=1, ray_actor_options={"num_cpus": 0})
class ReportBoardDeployment:
    """The deployment's one report board (serve/cluster.py)."""

    def __init__(self) -> None:
        self.board = ReportBoard()

    def exchange(self, report: ReplicaReport) -> list[Peer]:
        return self.board.put(report, time.monotonic())


@dataclass(frozen=True)
class _BoardClient:
    """serve/cluster.py's Cluster over the board deployment's handle."""

    board: object  # DeploymentHandle of ReportBoardDeployment
    replica: str
    target: int

    async def exchange(self, own: ReplicaReport) -> list[Peer]:
        return await self.board.exchange.remote(own)


@serve.ingress()
class CrucibleReplica:
    """One replica: its engine, loaded before Serve routes to it, under the app of serve/app.py."""

    async def __init__(self, config: ServerConfig, board, target: int) -> None:
        from max._mlir_context import ensure_default_mlir_context

        def load():
            with ensure_default_mlir_context():  # MAX's MLIR context is thread-local
                return make_engine(config)

        try:
            engine = await asyncio.to_thread(load)
        except Exception as exc:  # noqa: BLE001 - the driver reads this line from Serve's status
            raise RuntimeError(f"{LOAD_ERROR} status={exit_status(exc)}: cannot load model '{config.model}': "
                               f"{type(exc).__name__}: {one_line(exc)}") from None
        replica = serve.get_replica_context().replica_id.unique_id
        # Not self.app: Serve's ASGI wrapper owns that name.
        self.crucible_app = create_app(config, load_in_background=False, engine=engine,
                                       cluster=_BoardClient(board, replica, target))

    def __serve_build_asgi_app__(self):
        return self.crucible_app

    def check_health(self) -> None:
        """Serve's periodic check: a replica whose engine stopped is replaced."""
        state = self.crucible_app.state.crucible
        if state.fatal is not None:
            raise RuntimeError(state.fatal[1])
        if not state.engine_alive:
            raise RuntimeError("the engine thread has stopped")


def deployment(config: ServerConfig, cfg: RayServeConfig):
    """The Serve application: `cfg.replicas` CrucibleReplicas and their report board."""
    replicas = serve.deployment(
        CrucibleReplica, name="openai", num_replicas=cfg.replicas,
        ray_actor_options={"num_cpus": cfg.cpus_per_replica, "num_gpus": cfg.gpus_per_replica},
        max_ongoing_requests=config.max_in_flight + ADMISSION_HEADROOM,
        health_check_period_s=HEALTH_CHECK_PERIOD_S, graceful_shutdown_timeout_s=10,
        max_constructor_retry_count=cfg.replicas)  # a model that cannot load fails fast, not 20 times
    return replicas.bind(config, ReportBoardDeployment.bind(), cfg.replicas)


def run_ray_server(config: ServerConfig, cfg: RayServeConfig, host: str, port: int) -> int:
    """Deploys the replicas, serves until SIGINT/SIGTERM, then takes the application down.

    Returns:
        The exit status: 0 after an interrupt; else one line on stderr says why the replicas did not start
        (2 for a model that cannot load, as `crucible serve`).
    """
    import ray

    started_here = not ray.is_initialized()
    if started_here:
        ray.init(address=cfg.address, num_cpus=cfg.local_cpus if cfg.address is None else None,
                 include_dashboard=False, log_to_driver=False, runtime_env={"env_vars": forwarded_env()})
    def on_signal(signum, frame) -> None:  # noqa: ARG001 - signal handler signature
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_signal)
    try:
        serve.start(http_options={"host": host, "port": port}, proxy_location="HeadOnly")
        try:
            serve.run(deployment(config, cfg), name=APP_NAME, route_prefix="/")
        except RuntimeError as exc:
            status, message = _replica_error(exc)
            print(f"crucible serve: error: the replicas failed to start: {message}", file=sys.stderr, flush=True)
            return status
        print(f"[crucible] {cfg.replicas} replicas ready behind Ray Serve on http://{host}:{port}", file=sys.stderr,
              flush=True)
        while True:  # Serve runs the replicas (and replaces failed ones); this process only holds them up
            time.sleep(1.0)
    except KeyboardInterrupt:
        return 0
    finally:
        try:
            if started_here and cfg.address is None:
                serve.shutdown()
            else:
                serve.delete(APP_NAME)
        finally:
            if started_here:
                ray.shutdown()


def _replica_error(exc: RuntimeError) -> tuple[int, str]:
    """The exit status and one line for a failed deployment: the replicas' load error when they tagged one,
    else the last error line of Serve's status."""
    try:
        message = serve.status().applications[APP_NAME].deployments["openai"].message
    except Exception:  # noqa: BLE001 - no status to read: Serve's own message says what it knows
        message = str(exc)
    tagged = re.search(rf"{LOAD_ERROR} status=(\d+): (.*)", message)
    if tagged:
        return int(tagged.group(1)), tagged.group(2).strip()
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    return INTERNAL_ERROR, next((line for line in reversed(lines) if "Error" in line), lines[-1] if lines
                                else str(exc))
