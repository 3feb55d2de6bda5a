# The two commands of README.md. Each bootstraps .venv on first use (idempotent, instant when up to date).
#   make generate         # the main job until the server lands: answer a prompt on the embedded SmolLM2
#   make test             # the whole test suite (ARGS=... passed to pytest)
.PHONY: generate test setup
ARGS ?=

generate:
	@scripts/bootstrap.sh base
	.venv/bin/crucible generate $(ARGS)

test:
	@scripts/bootstrap.sh test
	.venv/bin/python -m pytest $(ARGS)

setup:
	@scripts/bootstrap.sh test
