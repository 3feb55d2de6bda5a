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
import threading
import time
from dataclasses import dataclass

from ray import serve

from crucible.core.errors import INTERNAL_ERROR, USER_ERROR, exit_status, one_line
from pipelines.ray_batch import forwarded_env
from serve.app import ServerConfig, create_app, make_engine
from serve.cluster import Peer, ReplicaReport, ReportBoard

APP_NAME = "crucible"
REPLICAS_NAME = "openai"  # the replicas' deployment in the application (beside the report board)
ADMISSION_HEADROOM = 8  # /health, /metrics and refused requests beside a full replica's admitted ones
HEALTH_CHECK_PERIOD_S = 5.0
WAIT_REPORT_S = 30.0  # how often a deployment that is still starting says what it waits for
WATCH_EVERY_S = 5.0
BOARD_TIMEOUT_S = 2.0
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
    """

    address: str | None = None
    replicas: int = 1
    cpus_per_replica: float = 1.0
    gpus_per_replica: float = 0.0

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
        async def call() -> list[Peer]:
            return await self.board.exchange.remote(own)

        # A board that is restarting queues calls rather than failing them: do not hold /health up.
        return await asyncio.wait_for(call(), BOARD_TIMEOUT_S)


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
        CrucibleReplica, name=REPLICAS_NAME, num_replicas=cfg.replicas,
        ray_actor_options={"num_cpus": cfg.cpus_per_replica, "num_gpus": cfg.gpus_per_replica},
        # No max_queued_requests: Serve counts a burst's requests as queued before it picks their replicas
        # (a bound of 4 turned a burst of 12 into 503s while the replicas had room).
        max_ongoing_requests=config.max_in_flight + ADMISSION_HEADROOM,
        health_check_period_s=HEALTH_CHECK_PERIOD_S, graceful_shutdown_timeout_s=10,
        max_constructor_retry_count=cfg.replicas)  # a model that cannot load fails fast, not 20 times
    return replicas.bind(config, ReportBoardDeployment.bind(), cfg.replicas)


def run_ray_server(config: ServerConfig, cfg: RayServeConfig, host: str, port: int) -> int:
    """Deploys the replicas, serves until SIGINT/SIGTERM, then takes the application down.

    Returns:
        The exit status: 0 after an interrupt; else one line on stderr says why the replicas did not start
        or stopped (2 for a model that cannot load or a cluster too small, as `crucible serve`).
    """
    import ray

    local = cfg.address is None
    started_here = not ray.is_initialized()
    if started_here:  # "local": a cluster of this process's own, never one that `ray start` left running
        ray.init(address="local" if local else cfg.address, num_cpus=None,
                 include_dashboard=False, log_to_driver=False, runtime_env={"env_vars": forwarded_env()})

    def on_signal(signum, frame) -> None:  # noqa: ARG001 - signal handler signature
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_signal)
    deployed = False
    try:
        problem = _cannot_deploy(cfg, ray.cluster_resources())
        if problem:
            print(f"crucible serve: error: {problem}", file=sys.stderr, flush=True)
            return USER_ERROR
        serve.start(http_options={"host": host, "port": port}, proxy_location="HeadOnly")
        deployed = True
        failure = _deploy(deployment(config, cfg))
        if failure is not None:
            status, message = failure
            print(f"crucible serve: error: the replicas failed to start: {message}", file=sys.stderr, flush=True)
            return status
        print(f"[crucible] {cfg.replicas} replicas ready behind Ray Serve on http://{host}:{port}", file=sys.stderr,
              flush=True)
        return _watch()
    except KeyboardInterrupt:
        return 0
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second signal must not cut the clean-up short
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            if deployed:
                serve.delete(APP_NAME)  # drains the replicas while the proxy still carries their streams
                if started_here and local:
                    serve.shutdown()
        finally:
            if started_here:
                ray.shutdown()


def _cannot_deploy(cfg: RayServeConfig, resources: dict[str, float]) -> str | None:
    """Why the replicas cannot all be placed on the cluster (its resources in total), or None; else Serve
    would wait for them silently. An autoscaling cluster that would grow is refused too."""
    need = {"CPU": cfg.replicas * cfg.cpus_per_replica, "GPU": cfg.replicas * cfg.gpus_per_replica}
    short = {k: v for k, v in need.items() if v > resources.get(k, 0.0) + 1e-9}
    if short:
        have = ", ".join(f"{resources.get(k, 0.0):g} {k}s" for k in short)
        want = ", ".join(f"{v:g} {k}s" for k, v in short.items())
        return (f"{cfg.replicas} replicas need {want} ({cfg.cpus_per_replica:g} CPUs and {cfg.gpus_per_replica:g} "
                f"GPUs each); the cluster has {have}")
    try:
        apps = serve.status().applications
    except Exception:  # noqa: BLE001 - no Serve on the cluster yet: nothing to clash with
        return None
    if APP_NAME in apps:
        return (f"an application named '{APP_NAME}' already runs on this Ray cluster (another crucible serve "
                "--ray?); stop it first")
    return None


def _deploy(app) -> tuple[int, str] | None:
    """Runs the application; returns None once every replica is up, else (exit status, message). While it
    waits, Serve's own account of what it waits for (a replica that cannot be scheduled, a slow load)
    goes to stderr every WAIT_REPORT_S."""
    outcome: dict[str, BaseException] = {}

    def run() -> None:
        try:
            serve.run(app, name=APP_NAME, route_prefix="/")
        except BaseException as exc:  # noqa: BLE001 - handed to the main thread
            outcome["error"] = exc

    worker = threading.Thread(target=run, name="crucible-serve-deploy", daemon=True)
    worker.start()
    last = time.monotonic()
    while worker.is_alive():
        worker.join(1.0)
        if worker.is_alive() and time.monotonic() - last > WAIT_REPORT_S:
            last = time.monotonic()
            print(f"[crucible] waiting for the replicas: {_status_line() or 'loading'}", file=sys.stderr,
                  flush=True)
    exc = outcome.get("error")
    if exc is None:
        return None
    if isinstance(exc, RuntimeError):
        return _replica_error(exc)
    return INTERNAL_ERROR, f"{type(exc).__name__}: {one_line(exc)}"


def _watch() -> int:
    """Holds the application up (Serve runs and replaces the replicas); says on stderr when its status
    changes; returns 1 if the cluster goes away."""
    seen = "RUNNING"
    while True:
        time.sleep(WATCH_EVERY_S)
        try:
            app = serve.status().applications.get(APP_NAME)
        except Exception as exc:  # noqa: BLE001 - the cluster is gone: nothing left to serve
            print(f"crucible serve: error: lost the Ray cluster: {one_line(exc)}", file=sys.stderr, flush=True)
            return INTERNAL_ERROR
        status = app.status.value if app else "DELETED"
        if status != seen:
            seen = status
            line = _status_line()
            print(f"[crucible] application {status}" + (f": {line}" if line else ""), file=sys.stderr, flush=True)
        if app is None:
            return INTERNAL_ERROR


def _status_message() -> str:
    """What Serve's status says of the replicas' deployment ("" when there is no status to read)."""
    try:
        return serve.status().applications[APP_NAME].deployments[REPLICAS_NAME].message
    except Exception:  # noqa: BLE001 - nothing deployed yet, or no cluster
        return ""


def _status_line() -> str:
    message = _status_message()
    return one_line(RuntimeError(message)) if message else ""


def _replica_error(exc: RuntimeError) -> tuple[int, str]:
    """The exit status and one line for a failed deployment: the replicas' load error when they tagged one,
    else the last error line of Serve's status."""
    message = _status_message() or str(exc)  # without a status, Serve's own message says what it knows
    tagged = re.search(rf"{LOAD_ERROR} status=(\d+): (.*)", message)
    if tagged:
        return int(tagged.group(1)), tagged.group(2).strip()
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    return INTERNAL_ERROR, next((line for line in reversed(lines) if "Error" in line), lines[-1] if lines
                                else str(exc))
