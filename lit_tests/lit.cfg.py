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
config.substitutions.append(("%examples", os.path.join(os.path.dirname(config.test_source_root), "examples")))
