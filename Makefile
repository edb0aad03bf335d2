# fxloom developer tasks. Run `make` (or `make help`) for the list.
#
# Every target that runs code first sets up .venv. Set-up is idempotent: it reruns only when
# pyproject.toml or constraints.txt change (tracked by a stamp file inside .venv).
# torch is installed first and explicitly, at the version pinned in constraints.txt, so pip
# never resolves a different torch (which would pull gigabytes of CUDA packages).

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
SETUP_STAMP := $(VENV)/.fxloom-setup.stamp
LINT_STAMP := $(VENV)/.fxloom-lint.stamp
TORCH_PIN := $(shell grep -E '^torch==' constraints.txt)
PYTEST_ARGS ?=
BENCH_ARGS ?=
BENCH_TRACE_ARGS ?=
ZOO_ARGS ?=
MATRIX_ARGS ?=
RED_TEAM_EXAMPLES ?= 20000
RED_TEAM_SEED ?= 0
DIFFERENTIAL_EXAMPLES ?= 10000
DIFFERENTIAL_SEED ?= 0
DIFFERENTIAL_FAMILIES ?=
DIFFERENTIAL_SUMMARY ?= differential-summary.json

.DEFAULT_GOAL := help
.PHONY: help setup demo test test-matrix red-team differential bench bench-passes zoo lint format clean distclean

help: ## list the targets
	@awk -F ':.*## ' '/^[a-z-]+:.*## / { printf "  make %-12s %s\n", $$1, $$2 }' $(MAKEFILE_LIST)

setup: $(SETUP_STAMP) ## create .venv and install fxloom (editable) with its test extras

$(SETUP_STAMP): pyproject.toml constraints.txt
	@test -n "$(TORCH_PIN)" || { echo "constraints.txt has no 'torch==' pin" >&2; exit 1; }
	@test -x $(PY) || { echo "creating $(VENV)"; $(PYTHON) -m venv $(VENV); }
	@echo "installing $(TORCH_PIN)"
	$(PIP) install -q "$(TORCH_PIN)"
	@echo "installing fxloom[test] with constraints.txt"
	$(PIP) install -q -e '.[test]' -c constraints.txt
	@# torch.fx's clients for tests/compat, beside the venv and off its path (pyproject's compat
	@# extra says why); best effort: without them tests/compat skips, saying so.
	$(PIP) install -q --no-deps --target $(VENV)/compat-packages -c constraints.txt \
		torchvision timm pillow || echo "note: tests/compat will skip (torchvision/timm not installed)"
	@# Graphviz's `dot` renders `fxloom draw` images; no pip package installs it. Best effort:
	@# apt-get when root, else a note; set-up never fails over it.
	@command -v dot >/dev/null 2>&1 || { command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ] \
		&& echo "installing Graphviz (dot) with apt-get" \
		&& { apt-get install -y -q graphviz >/dev/null 2>&1 \
			|| { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q graphviz >/dev/null; }; }; } \
		|| echo "note: install Graphviz (dot) for 'fxloom draw' to render images: apt-get/brew/conda install graphviz"
	@touch $@

demo: $(SETUP_STAMP) ## set up, then run the demo (`fxloom demo`)
	$(VENV)/bin/fxloom demo

test: $(SETUP_STAMP) ## set up, then run the tests (extra pytest flags: PYTEST_ARGS=...)
	$(PY) -m pytest $(PYTEST_ARGS)

test-matrix: $(SETUP_STAMP) ## run the tests on other Python/torch/transformers versions (cached envs; MATRIX_ARGS=)
	$(PY) tools/test_matrix.py $(MATRIX_ARGS)

red-team: $(SETUP_STAMP) ## the generative red team's long run: RED_TEAM_EXAMPLES mutants (20000), RED_TEAM_SEED=
	FXLOOM_RED_TEAM_EXAMPLES=$(RED_TEAM_EXAMPLES) FXLOOM_RED_TEAM_SEED=$(RED_TEAM_SEED) \
		$(PY) -m pytest tests/serialize/red_team/test_generative_red_team.py -q -s $(PYTEST_ARGS)

differential: $(SETUP_STAMP) ## fxloom.compile's differential long run: DIFFERENTIAL_EXAMPLES programs (10000), DIFFERENTIAL_SEED=, DIFFERENTIAL_FAMILIES=all|a,b
	FXLOOM_DIFFERENTIAL_EXAMPLES=$(DIFFERENTIAL_EXAMPLES) FXLOOM_DIFFERENTIAL_SEED=$(DIFFERENTIAL_SEED) \
		FXLOOM_DIFFERENTIAL_FAMILIES="$(DIFFERENTIAL_FAMILIES)" FXLOOM_DIFFERENTIAL_SUMMARY="$(DIFFERENTIAL_SUMMARY)" \
		$(PY) -m pytest tests/bytecode/differential/test_generated.py -q -s -p no:cacheprovider $(PYTEST_ARGS)

bench: $(SETUP_STAMP) ## set up, run the graph then the tracing benchmarks (BENCH_ARGS=, BENCH_TRACE_ARGS=)
	$(PY) benchmarks/bench_graph.py $(BENCH_ARGS)
	$(PY) benchmarks/bench_trace.py $(BENCH_TRACE_ARGS)

bench-passes: $(SETUP_STAMP) ## set up, run the pass benchmarks: fusion, shapes and cost, rewriting (BENCH_ARGS=)
	$(PY) benchmarks/bench_fuse.py $(BENCH_ARGS)
	$(PY) benchmarks/bench_shape_cost.py $(BENCH_ARGS)
	$(PY) benchmarks/bench_rewrite.py $(BENCH_ARGS)

zoo: $(SETUP_STAMP) ## set up, capture the model zoo with every method; write benchmarks/zoo/RESULTS.md (ZOO_ARGS=)
	$(PY) -m benchmarks.zoo.run $(ZOO_ARGS)

$(LINT_STAMP): $(SETUP_STAMP)
	$(PIP) install -q ruff -c constraints.txt
	@touch $@

lint: $(LINT_STAMP) ## ruff check + ruff format --check
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: $(LINT_STAMP) ## rewrite files with ruff format and apply ruff's safe fixes
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

clean: ## remove build outputs and caches (keeps .venv)
	rm -rf build dist *.egg-info .pytest_cache .hypothesis .ruff_cache
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -prune -exec rm -rf {} +

distclean: clean ## clean, and remove .venv too
	rm -rf $(VENV)
