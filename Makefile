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

LOWER := unroll{k=8},split-quantiles,insert-comm,insert-reshard,annotate-cost,schedule
# The demo gives the optimizer 15 s; `rpegc FILE -O` runs the same pipeline with the default 60 s budget.
DEMO_PIPELINE := verify-wellformed,optimize{budget=15 seed=0},$(LOWER)

demo: $(STAMP)
	@mkdir -p $(OUT)
	@echo "== 1. optimize the PPO example (64 GH200 GPUs), lower, cost and schedule it =="
	$(BIN)/rpegc examples/ppo.rpeg -p '$(DEMO_PIPELINE)' -o $(OUT)/ppo.exec.rpeg --summary --gantt $(OUT)/ppo-gantt.png
	@echo "== 2. execute the plan on the simulated backend and verify the trace =="
	$(BIN)/rpeg-run $(OUT)/ppo.exec.rpeg --backend sim --trace $(OUT)/ppo.trace.jsonl
	$(BIN)/rpeg-run verify $(OUT)/ppo.exec.rpeg $(OUT)/ppo.trace.jsonl

test: $(STAMP)
	@$(BIN)/python tests/run_all.py

clean:
	rm -rf $(OUT) build *.egg-info lit_tests/Output
