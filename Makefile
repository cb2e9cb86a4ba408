# rpegc: `make demo` and `make test` are the two commands a fresh machine needs (see README).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.rpegc-installed
OUT    := out

.PHONY: demo test install clean

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q -e '.[dev,runtime]'
	@touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	@mkdir -p $(OUT)
	$(BIN)/rpegc examples/ppo.rpeg -p verify-wellformed --summary

test: $(STAMP)
	@$(BIN)/python tests/run_all.py

clean:
	rm -rf $(OUT) build *.egg-info lit_tests/Output
