"""Writing a result file so that readers see the old file or the whole new one, never half of it."""

from __future__ import annotations

import os
from pathlib import Path


def write_text_atomic(path: Path, text: str) -> None:
    """Writes `text` to a temporary sibling of `path`, then renames it over `path`.

    A writer killed mid-way (a benchmark cut off at a time limit, Ctrl-C) leaves at most a stray
    `*.tmp<pid>` file next to the target, never a truncated result under the final name. The rename is
    atomic because the temporary file is in the same directory, hence on the same file system.

    Args:
        path: the file to create or replace.
        text: its whole new content.
    """
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
    try:
        tmp.write_text(text)
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)
