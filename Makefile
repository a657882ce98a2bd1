# Two commands do all set-up on a fresh machine (see README.md):
#   make demo   - create .venv, install opforge, run `opforge demo`
#   make test   - create .venv, install opforge with test tools, run the suite
#                 (and .venv-flink: PyFlink for tests/stream/test_flink_oracle.py;
#                 .venv-tpcds: DuckDB's TPC-DS generator for tests/sql/tpcds)
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

# PyFlink, the oracle of tests/stream/test_flink_oracle.py, in its own venv:
# apache-flink pins numpy, pandas, pyarrow and apache-beam versions that
# conflict with opforge's pins. It needs Java 17 at test time.
FLINK_VENV := .venv-flink
FLINK_STAMP := $(FLINK_VENV)/.installed
FLINK_PINS := tests/stream/flink_oracle/requirements.txt

# DuckDB's tpcds extension (data + the 99 queries of tests/sql/tpcds) loads only into duckdb 1.5.5;
# the tests' reference DuckDB is newer, so the generator has its own venv too.
TPCDS_VENV := .venv-tpcds
TPCDS_STAMP := $(TPCDS_VENV)/.installed
TPCDS_PINS := tests/sql/tpcds/requirements.txt

.PHONY: demo test venv bench clean .venv-flink .venv-tpcds

$(STAMP): pyproject.toml requirements-pins.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -r requirements-pins.txt
	$(BIN)/python -m pip install -q -c requirements-pins.txt -e ".[dev]"
	touch $(STAMP)

venv: $(STAMP)

$(FLINK_STAMP): $(FLINK_PINS)
	$(PYTHON) -m venv $(FLINK_VENV)
	$(FLINK_VENV)/bin/python -m pip install -q --upgrade pip
	$(FLINK_VENV)/bin/python -m pip install -q -r $(FLINK_PINS)
	touch $(FLINK_STAMP)

.venv-flink: $(FLINK_STAMP)

$(TPCDS_STAMP): $(TPCDS_PINS)
	$(PYTHON) -m venv $(TPCDS_VENV)
	$(TPCDS_VENV)/bin/python -m pip install -q --upgrade pip
	$(TPCDS_VENV)/bin/python -m pip install -q -r $(TPCDS_PINS)
	touch $(TPCDS_STAMP)

.venv-tpcds: $(TPCDS_STAMP)

demo: $(STAMP)
	$(BIN)/opforge demo

test: $(STAMP) $(FLINK_STAMP) $(TPCDS_STAMP)
	$(BIN)/python -m pytest -q -n 2 --durations=15

bench: $(STAMP)
	$(BIN)/opforge bench --json benchmarks/results/local.json --plot benchmarks/results/local-roofline.png

clean:
	rm -rf $(VENV) $(FLINK_VENV) $(TPCDS_VENV) build src/*.egg-info
