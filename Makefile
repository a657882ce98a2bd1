# Two commands do all set-up on a fresh machine (see README.md):
#   make demo   - create .venv, install opforge, run `opforge demo`
#   make test   - create .venv, install opforge with test tools, run the suite
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test venv bench clean

$(STAMP): pyproject.toml requirements-pins.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -r requirements-pins.txt
	$(BIN)/python -m pip install -q -c requirements-pins.txt -e ".[dev]"
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(BIN)/opforge demo

test: $(STAMP)
	$(BIN)/python -m pytest -q -n 2 --durations=15

bench: $(STAMP)
	$(BIN)/opforge bench --json benchmarks/results/local.json --plot benchmarks/results/local-roofline.png

clean:
	rm -rf $(VENV) build src/*.egg-info
