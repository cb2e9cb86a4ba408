"""Backend options declared once (runtime/backends/options.py): each field of a backend's options dataclass is its
rpeg-run flag, with the field's default, help, choices and type."""

import argparse
import dataclasses

import pytest

from rpegc.core.ir.options import HELP
from rpegc.runtime.backends.options import CLI, add_declared_options
from rpegc.runtime.backends.sim import SimOptions
from rpegc.runtime.backends.torch.controller.options import TorchOptions


def parser(options: type) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    add_declared_options(p.add_argument_group("g"), options)
    return p


@pytest.mark.parametrize("options", [SimOptions, TorchOptions])
def test_every_field_is_a_documented_flag_with_the_fields_default(options):
    fields = [f for f in dataclasses.fields(options) if f.metadata[CLI]["cli"]]
    assert fields and all(f.metadata[HELP] for f in dataclasses.fields(options))
    args = vars(parser(options).parse_args([]))
    assert args == {f.name: f.default for f in fields}
    built = options(**args)  # what rpeg-run hands the backend: rpeg-run's own fields (the seed) keep their default
    assert built == options()


def test_flags_take_the_fields_types_choices_and_repeats():
    p = parser(TorchOptions)
    a = p.parse_args(["--checkpoint-every", "3", "--lr", "0.1", "--rl", "a=1", "--rl", "b=2", "--overwrite",
                      "--task", "reverse", "--run-dir", "d"])
    assert (a.checkpoint_every, a.lr, a.rl, a.overwrite, a.task, a.run_dir) == (3, 0.1, ["a=1", "b=2"], True,
                                                                               "reverse", "d")
    for bad in (["--task", "other"], ["--checkpoint-every", "x"], ["--lr", "fast"], ["--seed", "1"]):
        with pytest.raises(SystemExit):
            p.parse_args(bad)
