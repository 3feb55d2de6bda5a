"""Builds the Mojo kernel package once per content hash and hands graphs the prebuilt ``.mojoc``.

Passing the ``kernels/`` source folder to ``Graph(custom_extensions=...)`` re-precompiles it on every
graph and session (2-3 s each, no up-to-date check). Instead we precompile once into
``build/kernels-<hash>/crucible_kernels.mojoc`` (the file stem becomes a Mojo module name, so it
must be an identifier), where the hash covers every ``.mojo`` file and the Mojo
version; records (benchmarks, qualification) cite that hash as the kernel build they ran.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from crucible.core.proc import child_env, find_tool

REPO_ROOT = Path(__file__).resolve().parents[2]
KERNELS_DIR = REPO_ROOT / "kernels"


class KernelBuildError(RuntimeError):
    """``mojo precompile`` failed; the message carries the compiler's errors."""


@dataclass(frozen=True)
class KernelBuild:
    """A prebuilt kernel package.

    Attributes:
        path: The ``.mojoc`` file to pass as a custom extension.
        content_hash: sha256 (first 16 hex digits) of the kernel sources and the Mojo version.
        mojo_version: ``mojo --version`` output.
    """

    path: Path
    content_hash: str
    mojo_version: str


def _mojo_binary() -> str:
    found = find_tool("mojo")
    if found is None:
        raise KernelBuildError("the `mojo` compiler is not installed (pip install modular==26.7.0)")
    return found


@lru_cache(maxsize=1)
def mojo_version() -> str:
    """The Mojo compiler's version line."""
    out = subprocess.run([_mojo_binary(), "--version"], capture_output=True, text=True, check=True,
                         env=child_env())
    return out.stdout.strip()


def kernel_sources_hash(kernels_dir: Path = KERNELS_DIR) -> str:
    """Hash of every ``.mojo`` file (relative name and bytes) plus the Mojo version."""
    h = hashlib.sha256()
    for path in sorted(kernels_dir.rglob("*.mojo")):
        h.update(path.relative_to(kernels_dir).as_posix().encode())
        h.update(b"\0")
        h.update(path.read_bytes())
        h.update(b"\0")
    h.update(mojo_version().encode())
    return h.hexdigest()[:16]


def _build_dir() -> Path:
    return Path(os.environ.get("CRUCIBLE_BUILD_DIR", REPO_ROOT / "build"))


PREBUILT_ENV = "CRUCIBLE_PREBUILT_KERNELS"


def _prebuilt(path: Path) -> KernelBuild:
    # A package built elsewhere (e.g. carried to a GPU machine that has no `mojo` to run): its
    # build-info.json says which sources and compiler produced it.
    info = json.loads((path.parent / "build-info.json").read_text())
    return KernelBuild(path=path, content_hash=info["content_hash"], mojo_version=info["mojo_version"])


@lru_cache(maxsize=4)
def kernel_package(kernels_dir: Path = KERNELS_DIR) -> KernelBuild:
    """Returns the prebuilt kernel package, precompiling it if this content hash has no build yet.

    Safe to call from concurrent processes: a file lock serializes the build, and the package appears
    under its final name atomically. $CRUCIBLE_PREBUILT_KERNELS names a package built elsewhere.

    Raises:
        KernelBuildError: The compiler rejected the sources.
    """
    if os.environ.get(PREBUILT_ENV):
        return _prebuilt(Path(os.environ[PREBUILT_ENV]))
    digest = kernel_sources_hash(kernels_dir)
    out_dir = _build_dir() / f"kernels-{digest}"
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / "crucible_kernels.mojoc"
    if not target.exists():
        with open(out_dir / ".kernel-build.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not target.exists():
                # The output's stem is baked in as the Mojo module name: build under the final name
                # in a private folder, then move it into place.
                tmp_dir = out_dir / f"tmp-{os.getpid()}"
                tmp_dir.mkdir(exist_ok=True)
                tmp = tmp_dir / target.name
                proc = subprocess.run(
                    [_mojo_binary(), "precompile", str(kernels_dir), "-o", str(tmp)],
                    capture_output=True, text=True, env=child_env(),
                )
                if proc.returncode != 0 or not tmp.exists():
                    errors = "\n".join(
                        line for line in (proc.stdout + proc.stderr).splitlines()
                        if "error" in line or line.startswith(" ")
                    )
                    raise KernelBuildError(f"mojo precompile {kernels_dir} failed:\n{errors[-4000:]}")
                (out_dir / "build-info.json").write_text(json.dumps(
                    {"content_hash": digest, "mojo_version": mojo_version(), "sources": str(kernels_dir)}))
                tmp.replace(target)
                shutil.rmtree(tmp_dir, ignore_errors=True)
    return KernelBuild(path=target, content_hash=digest, mojo_version=mojo_version())
