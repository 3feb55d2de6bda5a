"""`crucible serve`: the OpenAI-compatible server under uvicorn (loopback by default)."""

from __future__ import annotations

import logging
import os

from serve.app import ServerConfig, create_app

API_KEY_ENV = "CRUCIBLE_API_KEY"


def run_server(config: ServerConfig, host: str = "127.0.0.1", port: int = 8000) -> None:
    """Serves until interrupted. The API key comes from the config or $CRUCIBLE_API_KEY."""
    import uvicorn

    if config.api_key is None and os.environ.get(API_KEY_ENV):
        from dataclasses import replace

        config = replace(config, api_key=os.environ[API_KEY_ENV])
    if host not in ("127.0.0.1", "localhost", "::1") and not config.api_key:
        logging.getLogger("crucible").warning("serving on %s without an API key: anyone who can reach it can use it",
                                              host)
    uvicorn.run(create_app(config), host=host, port=port, log_level="warning", timeout_graceful_shutdown=5)
