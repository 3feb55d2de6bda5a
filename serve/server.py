"""`crucible serve`: the OpenAI-compatible server under uvicorn (loopback by default)."""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import replace

from serve.app import ServerConfig, create_app

API_KEY_ENV = "CRUCIBLE_API_KEY"


def with_api_key(config: ServerConfig, host: str) -> ServerConfig:
    """The config with $CRUCIBLE_API_KEY when it names no key; warns when a non-loopback host has none."""
    if config.api_key is None and os.environ.get(API_KEY_ENV):
        config = replace(config, api_key=os.environ[API_KEY_ENV])
    if host not in ("127.0.0.1", "localhost", "::1") and not config.api_key:
        logging.getLogger("crucible").warning("serving on %s without an API key: anyone who can reach it can use it",
                                              host)
    return config


def run_server(config: ServerConfig, host: str = "127.0.0.1", port: int = 8000) -> int:
    """Serves until interrupted, or until the model fails to load or the engine stops.

    The API key comes from the config or $CRUCIBLE_API_KEY.

    Returns:
        The exit status: 0 after an interrupt, else the failure's (one line on stderr says why).
    """
    import uvicorn

    config = with_api_key(config, host)
    app = create_app(config)
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning",
                                           timeout_graceful_shutdown=5))
    state = app.state.crucible

    def stop() -> None:
        server.should_exit = True  # uvicorn's main loop polls it; pending responses finish first

    state.on_fatal = stop
    if state.fatal is not None:  # failed before the hook was set
        stop()
    server.run()
    if state.fatal is not None:
        status, message = state.fatal
        print(f"crucible serve: error: {message}", file=sys.stderr, flush=True)
        return status
    return 0
