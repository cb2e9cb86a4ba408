# lit configuration: golden tests of `rpegc` output. Each test file carries `// RUN:` lines.
import os
import sys

import lit.formats

config.name = "rpegc"
config.test_format = lit.formats.ShTest()
config.suffixes = [".rpeg", ".mlir", ".test"]
config.test_source_root = os.path.dirname(__file__)
config.excludes = ["lit.cfg.py", "Inputs"]
# Tests run the rpegc, filecheck and xdsl-opt of the environment lit itself runs in.
bin_dir = os.path.dirname(sys.executable)
config.environment["PATH"] = bin_dir + os.pathsep + os.environ.get("PATH", "")
# Goldens price `hardware = "cpu"` with the shipped reference profile, not this machine's (tests/conftest.py).
config.environment["RPEGC_CPU_PROFILE"] = "cpu-reference"
config.substitutions.append(("%examples", os.path.join(os.path.dirname(config.test_source_root), "examples")))
# LLVM's own mlir-opt (Debian's mlir-19-tools, which .ci/run installs): tests that need it say
# `REQUIRES: mlir-opt` and are reported unsupported where it is missing.
import shutil

mlir_opt = shutil.which("mlir-opt") or shutil.which("mlir-opt-19") or shutil.which("mlir-opt", path="/usr/lib/llvm-19/bin")
if mlir_opt:
    config.available_features.add("mlir-opt")
    config.substitutions.append(("%mlir-opt", mlir_opt))
