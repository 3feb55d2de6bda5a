# The two commands of README.md. Each bootstraps .venv on first use (idempotent, instant when up to date).
#   make serve            # the main job: the OpenAI-compatible server on the embedded SmolLM2 (ARGS=... for options)
#   make test             # the whole test suite (ARGS=... passed to pytest)
.PHONY: serve test setup
ARGS ?=

serve:
	@scripts/bootstrap.sh base
	.venv/bin/crucible serve $(ARGS)

test:
	@scripts/bootstrap.sh test
	.venv/bin/python -m pytest $(ARGS)

setup:
	@scripts/bootstrap.sh test
