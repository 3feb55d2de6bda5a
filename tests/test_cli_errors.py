"""User errors on the command line are one line on stderr and exit status 2, with no traceback;
CRUCIBLE_DEBUG=1 shows the traceback. Anything else is one line and status 1."""

from __future__ import annotations

from pathlib import Path

import pytest

from crucible import cli
from tests.support.tiny_models import TINY_LLAMA, write_gguf


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    try:
        status = cli.main(argv)
    except SystemExit as exc:  # argparse's own errors
        status = exc.code
    return status, capsys.readouterr().err


def _one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


@pytest.fixture(scope="module")
def odd_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    import gguf

    root = tmp_path_factory.mktemp("odd-models")
    arch = root / "gpt2.gguf"  # a valid GGUF of an architecture Crucible does not run
    w = gguf.GGUFWriter(str(arch), "gpt2")
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", __import__("numpy").zeros((4, 4), dtype="float32"))
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
    not_gguf = root / "notes.gguf"
    not_gguf.write_text("hello")
    corrupt = root / "corrupt.gguf"  # the magic and version of a GGUF, then garbage (a torn download)
    corrupt.write_bytes(b"GGUF" + (3).to_bytes(4, "little") + b"\xff" * 64)
    return {"mxfp4": write_gguf(TINY_LLAMA, root / "tiny-MXFP4.gguf", "MXFP4"), "gpt2": arch, "not_gguf": not_gguf,
            "corrupt": corrupt}


@pytest.mark.parametrize("case,argv,words", [
    ("tensor type", ["generate", "--model", "{mxfp4}"], "MXFP4"),
    ("architecture", ["generate", "--model", "{gpt2}"], "gpt2"),
    ("not a GGUF", ["generate", "--model", "{not_gguf}"], "not a GGUF"),
    ("corrupt GGUF", ["generate", "--model", "{corrupt}"], "not a readable GGUF"),
    ("missing file", ["generate", "--model", "/no/such/model.gguf"], "no such file"),
    ("replicas without --ray", ["serve", "--replicas", "2", "--cpus-per-replica", "4"], "--cpus-per-replica needs --ray"),
    ("unknown name", ["serve", "--model", "llama-99b"], "not a registry name"),
    ("batch input", ["batch", "/no/such/in.jsonl", "out.jsonl"], "does not exist"),
    ("bad port", ["serve", "--port", "99999"], "--port"),
    ("bad count", ["generate", "--max-tokens", "0"], "--max-tokens"),
    ("bad number", ["serve", "--kv-cache-gib", "lots"], "--kv-cache-gib"),
    ("bad choice", ["serve", "--activations", "q2"], "--activations"),
    ("bf16 on cpu", ["serve", "--dtype", "bfloat16"], "GPU only"),
    ("no reference", ["qualify", "--reference", "/no/such/ref.npz"], "does not exist"),
    ("bad dtype", ["batch", "in.jsonl", "out.jsonl", "--dtype", "fp8"], "--dtype"),
    ("unknown flag", ["models", "--colour"], "--colour"),
])
def test_user_errors_are_one_line_and_status_2(case: str, argv: list[str], words: str, odd_models,
                                               capsys: pytest.CaptureFixture[str], monkeypatch, tmp_path) -> None:
    monkeypatch.delenv("CRUCIBLE_DEBUG", raising=False)
    monkeypatch.chdir(tmp_path)
    status, err = _run([a.format(**odd_models) for a in argv], capsys)
    line = _one_line(err)
    assert status == 2, (case, err)
    assert line.startswith("crucible") and "error:" in line and words in line, (case, line)


def test_debug_shows_the_traceback(odd_models, capsys: pytest.CaptureFixture[str], monkeypatch) -> None:
    monkeypatch.setenv("CRUCIBLE_DEBUG", "1")
    status, err = _run(["generate", "--model", str(odd_models["gpt2"])], capsys)
    assert status == 2 and "Traceback" in err and "UnsupportedModelError" in err


def test_a_bug_is_one_line_and_status_1(capsys: pytest.CaptureFixture[str], monkeypatch) -> None:
    monkeypatch.delenv("CRUCIBLE_DEBUG", raising=False)

    def broken(args) -> int:
        raise KeyError("planted")

    monkeypatch.setattr(cli, "cmd_models", broken)
    status, err = _run(["models"], capsys)
    line = _one_line(err)
    assert status == 1 and "KeyError" in line and "CRUCIBLE_DEBUG=1" in line


def test_serve_takes_no_prefix_caching() -> None:
    from crucible.cli import build_parser

    assert build_parser().parse_args(["serve"]).prefix_caching is True
    assert build_parser().parse_args(["serve", "--no-prefix-caching"]).prefix_caching is False
