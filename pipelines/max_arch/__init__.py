"""Crucible's graphs as MAX pipeline architectures (``--custom-architectures pipelines.max_arch``).

MAX imports this module and registers every entry of ``ARCHITECTURES`` under the Hugging Face class
name it declares, overriding MAX's built-in architecture of that name. MAX's own pipeline then drives
our decoder graph: its tokenizer, its paged KV cache manager (Jenga), its continuous-batching
scheduler and its sampler graph; the decoder's hot path is Crucible's kernels.

    max generate --custom-architectures pipelines.max_arch --model-path <hf folder> --devices cpu ...
    max serve    --custom-architectures pipelines.max_arch --model-path <hf folder> --devices cpu ...
"""

import sys
from pathlib import Path

# `max serve` runs the model in a spawned worker whose interpreter is the one on PATH, given only the
# parent's sys.path: an editable install's import hook (a .pth file) does not run there, and the
# worker could not unpickle our pipeline model. The folder holding our packages goes on sys.path.
_PACKAGES_ROOT = str(Path(__file__).resolve().parents[2])
if _PACKAGES_ROOT not in sys.path:
    sys.path.append(_PACKAGES_ROOT)

from pipelines.max_arch.arch import ARCHITECTURES  # noqa: E402

__all__ = ["ARCHITECTURES"]
