"""The suite prices `hardware = "cpu"` with the shipped reference profile, not the machine it runs on (whose
profile `cpu` means everywhere else, rpegc/core/cost/machine.py): its numbers must not depend on the CPU, and it
must not calibrate. Set before any test runs, so the CLI processes the tests start inherit it too."""

import os

from rpegc.core.cost.machine import PIN_ENV

os.environ[PIN_ENV] = "cpu-reference"
