"""Running MAX's own CLI (`max generate`, `max serve`) as a child process, with or without our architecture.

Tests use it to check that MAX's pipeline drives Crucible's graph (``--custom-architectures
pipelines.max_arch``); benchmarks use it for MAX's built-in pipeline as a baseline. `max generate`
prints the generated text and then its metrics; ``parse_generate_output`` reads both.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from crucible.core.proc import child_env, find_tool, free_port, wait_healthy

CUSTOM_ARCHITECTURES = "pipelines.max_arch"

# `max generate` metric lines: "Prompt size: 21", "Eval throughput (token-generation): 155.0 tokens per second".
_METRICS = {
    "prompt_tokens": r"^Prompt size: (\d+)",
    "output_tokens": r"^Output size: (\d+)",
    "ttft_ms": r"^Time to first token: ([\d.]+) ms",
    "prefill_tok_s": r"^Prompt eval throughput \(context-encoding\): ([\d.]+) tokens per second",
    "decode_tok_s": r"^Eval throughput \(token-generation\): ([\d.]+) tokens per second",
}


class MaxCliError(RuntimeError):
    """The `max` command failed; the message carries the tail of its log."""


@dataclass(frozen=True)
class MaxGenerateResult:
    """One `max generate` run.

    Attributes:
        text: The generated text as MAX printed it.
        prompt_tokens: Prompt length after MAX's chat template.
        output_tokens: Generated tokens (an end-of-turn token included).
        ttft_ms: Time to first token.
        prefill_tok_s: MAX's context-encoding throughput.
        decode_tok_s: MAX's token-generation throughput.
        log: stderr (MAX's log lines; our architecture logs its kernel provenance there).
    """

    text: str
    prompt_tokens: int
    output_tokens: int
    ttft_ms: float
    prefill_tok_s: float
    decode_tok_s: float
    log: str


def max_binary() -> str:
    """The `max` entry point of the environment MAX is installed in."""
    found = find_tool("max")
    if found is None:
        raise MaxCliError("the `max` command is not installed (pip install modular==26.7.0)")
    return found


def parse_generate_output(stdout: str) -> dict[str, object]:
    """Splits `max generate`'s stdout into the text (everything before the metrics) and the metrics."""
    marker = stdout.rfind("\nPrompt size:")
    if marker < 0:
        raise MaxCliError(f"no metrics in `max generate` output:\n{stdout[-2000:]}")
    out: dict[str, object] = {"text": stdout[:marker]}
    tail = stdout[marker + 1:]
    for key, pattern in _METRICS.items():
        m = re.search(pattern, tail, re.MULTILINE)
        if m is None:
            raise MaxCliError(f"`max generate` printed no {key}:\n{tail[-2000:]}")
        out[key] = float(m.group(1)) if "." in m.group(1) or key.endswith(("_ms", "_s")) else int(m.group(1))
    return out


def max_generate(model_path: str | Path, prompt: str, max_new_tokens: int, *, custom: bool = True,
                 weight_path: str | Path | None = None, extra: tuple[str, ...] = (),
                 timeout_s: float = 1800) -> MaxGenerateResult:
    """Runs `max generate` greedily (top_k 1) on CPU.

    Args:
        model_path: A local Hugging Face folder (config, tokenizer, and weights unless weight_path).
        prompt: The user message; MAX applies the model's chat template.
        max_new_tokens: Generation budget.
        custom: Run Crucible's architecture (pipelines.max_arch) instead of MAX's built-in one.
        weight_path: A weight file to use instead of the folder's (a GGUF file).
        extra: More `max generate` options (e.g. "--num-warmups", "2").
        timeout_s: Wall-clock limit.

    Raises:
        MaxCliError: Non-zero exit or unreadable output.
    """
    cmd = [max_binary(), "generate", "--model-path", str(model_path), "--devices", "cpu",
           "--prompt", prompt, "--max-new-tokens", str(max_new_tokens), "--top-k", "1", *extra]
    if weight_path is not None:
        cmd += ["--weight-path", str(weight_path)]
    if custom:
        cmd += ["--custom-architectures", CUSTOM_ARCHITECTURES]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s,
                          env=child_env({"MAX_SERVE_DISABLE_TELEMETRY": "1"}))
    if proc.returncode != 0:
        raise MaxCliError(f"`{' '.join(cmd)}` exited {proc.returncode}:\n{proc.stderr[-4000:]}")
    parsed = parse_generate_output(proc.stdout)
    return MaxGenerateResult(log=proc.stderr, **parsed)  # type: ignore[arg-type]


@dataclass
class MaxServer:
    """A running `max serve` process."""

    base_url: str
    process: subprocess.Popen
    log_path: Path

    @property
    def v1(self) -> str:
        return self.base_url + "/v1"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def start_max_serve(model_path: str | Path, log_path: Path, *, custom: bool = True,
                    extra: tuple[str, ...] = (), timeout_s: float = 1200, devices: str = "cpu") -> MaxServer:
    """Starts `max serve` on a free loopback port (its metrics endpoint on another) with its log in a
    file, so a full pipe never blocks it, and waits until /health answers.

    Raises:
        MaxCliError: It exited or did not become healthy in time.
    """
    port = free_port()
    cmd = [max_binary(), "serve", "--model-path", str(model_path), "--devices", devices,
           "--host", "127.0.0.1", "--port", str(port), *extra]
    if custom:
        cmd += ["--custom-architectures", CUSTOM_ARCHITECTURES]
    log = log_path.open("w")
    env = child_env({"MAX_SERVE_DISABLE_TELEMETRY": "1", "MAX_SERVE_METRICS_ENDPOINT_PORT": str(free_port())})
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, text=True, env=env)
    log.close()
    server = MaxServer(f"http://127.0.0.1:{port}", proc, log_path)
    try:
        wait_healthy(server.base_url, proc, log_path, timeout_s)
    except RuntimeError as exc:
        server.stop()
        raise MaxCliError(f"`max serve` did not start: {exc}") from exc
    return server
