"""The suite prices `hardware = "cpu"` with the shipped reference profile, not the machine it runs on (whose
profile `cpu` means everywhere else, rpegc/core/cost/machine.py): its numbers must not depend on the CPU, and it
must not calibrate. Set before any test runs, so the CLI processes the tests start inherit it too."""

import os

from hypothesis import settings

from rpegc.core.cost.machine import PIN_ENV

os.environ[PIN_ENV] = "cpu-reference"

# Hypothesis' default deadline (200 ms an example) is a wall-clock assertion, which no test makes: the suite runs two
# test processes on two cores (tests/run_all.py), and an example's time is the moment's.
settings.register_profile("suite", deadline=None)
settings.load_profile("suite")
