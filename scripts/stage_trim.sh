#!/usr/bin/env bash
# Repacks the MAX stage of ../shared/device/stage-max.sh (three ~60 MB parts in .devstage/) into two parts
# of <= 56 MiB, so the GPU machine needs two back-to-back calls instead of three.
#   bash scripts/stage_trim.sh          (after stage-max.sh; about 5 minutes on 2 cores)
# Why: the machine goes back ~30 s after a call, and the upload of the next call's carry counts as idle.
# On 2026-12-04 three of six call-to-call transitions found a fresh machine (and an empty /tmp/stage);
# each chained call is one more chance to lose the stage.
# What it leaves out, each checked on that day:
#   - bin/lld (115 MB): graph compiles on the CPU and on the H200 ran without it;
#   - modular/lib/nixl plugins (17 MB): KV transfer between machines, never loaded here;
#   - bin/mojo (140 MB) becomes a stub script. MAX only checks that it exists when it loads a .mojoc,
#     but max.nn imports max._kv_cache_ops, a Mojo module that the mojo importer builds with `mojo build`
#     on first import; it is prebuilt here (shared library, named by the importer's source hash), so
#     the stub is never run. If it is, it says so on stderr.
set -euo pipefail
parts=(.devstage/max-site.tar.xz.part-*)
[[ -e "${parts[0]}" ]] || { echo "no .devstage parts: run ../shared/device/stage-max.sh first" >&2; exit 1; }
mojo_bin="${MOJO:-.venv/bin/mojo}"
py="${PYTHON:-.venv/bin/python}"
site=$(mktemp -d)
trap 'rm -rf "$site"' EXIT
cat "${parts[@]}" | xz -d -T0 | tar x -C "$site"
rm -f "$site"/mojo_compiler-*.data/platlib/modular/bin/lld
rm -rf "$site"/max_core-*.data/platlib/modular/lib/nixl
ops="$site/max/_kv_cache_ops"
hash=$("$py" -c "import sys; from pathlib import Path; from mojo.importer import _calculate_mojo_source_hash as h; \
print(h(Path(sys.argv[1])))" "$ops")
mkdir -p "$ops/__mojocache__"
"$mojo_bin" build "$ops/kv_cache_ops.mojo" --emit shared-lib -o "$ops/__mojocache__/kv_cache_ops.hash-$hash.so"
stub=$(ls "$site"/mojo_compiler-*.data/platlib/modular/bin/mojo)
printf '#!/bin/sh\necho "crucible device stage: the mojo binary was left out (scripts/stage_trim.sh); prebuild what needs it" >&2\nexit 1\n' > "$stub"
chmod +x "$stub"
tmp_parts=$(mktemp -d)
tar cf - -C "$site" . | xz -9 -T0 | split -b 56m -d - "$tmp_parts/max-site.tar.xz.part-"
rm -f .devstage/max-site.tar.xz.part-*
mv "$tmp_parts"/max-site.tar.xz.part-* .devstage/
rmdir "$tmp_parts"
ls -la .devstage
