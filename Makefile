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

PIPELINE := verify-wellformed,unroll{k=8},split-quantiles,insert-comm,insert-reshard,annotate-cost,schedule

demo: $(STAMP)
	@mkdir -p $(OUT)
	$(BIN)/rpegc examples/ppo.rpeg -p '$(PIPELINE)' -o $(OUT)/ppo.exec.rpeg --summary --gantt $(OUT)/ppo-gantt.png

test: $(STAMP)
	@$(BIN)/python tests/run_all.py

clean:
	rm -rf $(OUT) build *.egg-info lit_tests/Output
