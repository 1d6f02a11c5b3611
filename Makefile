# Two entry points for a fresh clone: `make demo` and `make test` (and `make bench`).
# Both create a local virtualenv in .venv on first use.
VENV ?= .venv
PY := $(VENV)/bin/python
PYTHON ?= python3
# The Rust extension (native/) is built by pip through maturin; two jobs suit a 2-core machine.
export CARGO_BUILD_JOBS ?= 2
NATIVE := native/Cargo.toml native/Cargo.lock $(wildcard native/src/*.rs)

.PHONY: demo test bench clean

$(VENV)/.installed: pyproject.toml $(NATIVE)
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -U pip
	$(PY) -m pip install -q -e '.[test]'
	touch $@

demo: $(VENV)/.installed
	$(VENV)/bin/compactstore demo

test: $(VENV)/.installed
	$(PY) -m pytest -q $(PYTEST_ARGS)

# The benchmarks' peers and plotting: benchmark-only dependencies (the bench extra).
$(VENV)/.bench-installed: $(VENV)/.installed pyproject.toml
	$(PY) -m pip install -q -e '.[test,bench]'
	touch $@

bench: $(VENV)/.bench-installed
	$(PY) benchmarks/run_all.py $(BENCH_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis *.egg-info native/target compactstore/native.*.so
