"""RL hyper-parameters from a TOML file and `--rl NAME=VALUE` (runtime/backends/torch/rl/hyperparameters.py): names,
types and ranges checked with located errors, precedence file < --rl < --lr, and the effective config
recorded in the trace header and the checkpoint identity."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from rpegc.core.ir.errors import RpegError
from rpegc.runtime.interrupt import resume_command
from rpegc.runtime.backends.torch.rl.hyperparameters import Settings, coerce, parse_overrides, read_rl_file, rl_settings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_values_take_their_fields_types():
    assert parse_overrides(["clip_eps=0.1", "ppo_epochs=2", "kl_in_reward=false", "kl_estimator=k3",
                            "adam_betas=0.9,0.95", "value_clip=none", "data.shuffle=false"]) == Settings(rl={
        "clip_eps": 0.1, "ppo_epochs": 2, "kl_in_reward": False, "kl_estimator": "k3", "adam_betas": (0.9, 0.95),
        "value_clip": None}, data={"shuffle": False})


@pytest.mark.parametrize("pair,match", [
    ("clip_eps", "give NAME=VALUE"),
    ("clip_epss=0.1", "did you mean clip_eps"),
    ("algorithm=dapoo", "unknown algorithm 'dapoo'; use one of ppo, grpo, dpo"),
    ("ppo_epochs=1.5", "ppo_epochs must be an integer"),
    ("kl_in_reward=yes", "must be true or false"),
    ("lr_actor=0", "lr_actor must be > 0.0"),
    ("lr_actor=nan", "lr_actor must be a number"),
    ("gamma=1.5", "gamma must be <= 1.0"),
    ("adam_betas=0.9,1.0", "adam_betas must lie in [0, 1)"),
    ("adam_betas=0.9", "a list of 2 numbers"),
    ("data.promt_key=q", "unknown data setting 'promt_key'; did you mean prompt_key"),
    ("data.shuffle=2", "shuffle must be true or false"),
    ("top_p=0", "top_p must be > 0.0"),
    ("top_p=1.2", "top_p must be <= 1.0"),
    ("top_k=-3", "top_k must be >= 0"),
    ("top_k=0.5", "top_k must be an integer"),
    ("ppo_minibatches=0", "ppo_minibatches must be >= 1"),
    # settings the float32 arithmetic cannot hold (issue 33, item 2: they trained NaN before)
    ("kl_coef=1e300", "kl_coef must be <= 10000.0"),
    ("adam_eps=1e-320", "adam_eps must be >= 1.1754943508222875e-38"),
    ("temperature=1e-300", "temperature must be >= 0.0001"),
    ("lr_actor=1e300", "lr_actor must be <= 1.0"),
    ("lr_critic=2", "lr_critic must be <= 1.0"),
])
def test_bad_settings_say_what_to_change(pair, match):
    with pytest.raises(RpegError) as e:
        parse_overrides([pair])
    assert match in e.value.message


def test_a_file_is_checked_at_the_keys_line_and_options_override_it(tmp_path):
    good = tmp_path / "rl.toml"
    good.write_text("# PPO settings\nclip_eps = 0.1\nppo_epochs = 2\nadam_betas = [0.9, 0.95]\n"
                    "[data]\nprompt_key = \"question\"\npath = \"a.jsonl\"\n")
    assert read_rl_file(str(good)) == Settings(rl={"clip_eps": 0.1, "ppo_epochs": 2, "adam_betas": (0.9, 0.95)},
                                               data={"prompt_key": "question", "path": "a.jsonl"})
    assert rl_settings(str(good), ["clip_eps=0.3", "data.truncation=left"], 1e-4, "b.jsonl") == Settings(
        rl={"clip_eps": 0.3, "ppo_epochs": 2, "adam_betas": (0.9, 0.95), "lr_actor": 1e-4, "lr_critic": 1e-4},
        data={"prompt_key": "question", "path": "b.jsonl", "truncation": "left"})
    bad = tmp_path / "bad.toml"
    bad.write_text("clip_eps = 0.1\n\n  temperature = -1\n")
    with pytest.raises(RpegError) as e:
        read_rl_file(str(bad))
    assert (e.value.loc.line, e.value.loc.col) == (3, 3) and "temperature must be >= 0.0001" in e.value.message
    broken = tmp_path / "broken.toml"
    broken.write_text("clip_eps = \n")
    with pytest.raises(RpegError, match="not valid TOML"):
        read_rl_file(str(broken))
    table = tmp_path / "table.toml"
    table.write_text("[ppo]\nclip_eps = 0.1\n")
    with pytest.raises(RpegError, match=r"\[ppo\] is not a table the RL config has"):
        read_rl_file(str(table))
    data = tmp_path / "data.toml"
    data.write_text("[data]\n\nchat_templat = \"never\"\n")
    with pytest.raises(RpegError, match="did you mean chat_template") as e:
        read_rl_file(str(data))


def test_a_null_only_field_accepts_none_and_numbers():
    assert coerce("value_clip", 0.3, "x") == 0.3 and coerce("value_clip", "none", "x") is None


def test_the_resume_command_keeps_the_rl_options():
    cmd = resume_command("p.rpeg", ["p.rpeg", "--rl-config", "rl.toml", "--rl", "clip_eps=0.1", "--quiet"], "run")
    assert "--rl-config rl.toml" in cmd and "--rl clip_eps=0.1" in cmd and "--quiet" not in cmd


def test_a_torch_run_records_the_effective_settings_and_checks_them_first(tmp_path):
    pytest.importorskip("torch")
    pipeline = "verify-wellformed,unroll{k=1},split-quantiles,insert-comm,insert-reshard,annotate-cost,schedule"
    subprocess.run([sys.executable, "-m", "rpegc.cli", os.path.join(ROOT, "examples", "grpo-tiny-2.rpeg"), "-p",
                    pipeline, "-o", "g.exec.rpeg"], cwd=tmp_path, check=True, capture_output=True)
    (tmp_path / "rl.toml").write_text("clip_eps = 0.1\nkl_coef = 0.05\nppo_epochs = 2\n")
    run = [sys.executable, "-m", "rpegc.runtime.cli", "g.exec.rpeg", "--backend", "torch", "--quiet"]
    proc = subprocess.run(run + ["--rl-config", "rl.toml", "--rl", "kl_coef=0.02", "--trace", "t.jsonl", "--run-dir",
                                 "run"], cwd=tmp_path, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    with open(tmp_path / "t.jsonl") as f:
        rl = json.loads(f.readline())["options"]["rl"]
    assert (rl["algorithm"], rl["clip_eps"], rl["kl_coef"], rl["ppo_epochs"]) == ("grpo", 0.1, 0.02, 2)
    # two passes per training operator, which the plan does not price: the summary says so
    assert ("note: --rl ppo_epochs = 2, ppo_minibatches = 1: each training operator makes 2 pass(es) over its batch "
            "and 2 optimizer step(s), but the plan prices one of each") in proc.stdout
    with open(tmp_path / "run" / "final" / "index.json") as f:
        assert json.load(f)["identity"]["run"]["rl"]["kl_coef"] == 0.02
    proc = subprocess.run(run + ["--rl", "clip_eps=-1", "--trace", "t2.jsonl"], cwd=tmp_path, capture_output=True,
                          text=True)
    assert proc.returncode == 1 and "clip_eps must be > 0.0" in proc.stderr and not (tmp_path / "t2.jsonl").exists()
    proc = subprocess.run(run + ["--rl", "loss_agg_mode=mean", "--trace", "t3.jsonl"], cwd=tmp_path,
                          capture_output=True, text=True)
    assert proc.returncode == 1 and not (tmp_path / "t3.jsonl").exists()
    assert proc.stderr.count("\n") == 1 and "unknown loss_agg_mode 'mean'; use one of token-mean" in proc.stderr


def test_training_passes_the_plan_does_not_price_are_named():
    """The cost model prices one pass and one optimizer step per training operator: a run with more says so, one
    without says nothing."""
    from dataclasses import replace

    from rpegc.runtime.backends.torch.controller.run_description import run_config

    from rpegc.runtime.backends.torch.controller.run_record import unpriced_passes
    from rpegc.syntax.parser import parse

    cfg = run_config(parse(open(os.path.join(ROOT, "examples", "grpo-tiny.rpeg")).read(), "g.rpeg"))
    assert unpriced_passes(cfg) is None
    note = unpriced_passes(replace(cfg, rl=replace(cfg.rl, ppo_minibatches=4)))
    assert "1 pass(es) over its batch and 4 optimizer step(s), but the plan prices one of each" in note
    note = unpriced_passes(replace(cfg, rl=replace(cfg.rl, ppo_epochs=3, ppo_minibatches=2)))
    assert "3 pass(es) over its batch and 6 optimizer step(s)" in note and "about 3x their predicted time" in note


def test_chat_template_kwargs_are_a_table_in_the_file_or_json_on_the_command_line(tmp_path):
    (tmp_path / "rl.toml").write_text("[data]\nchat_template_kwargs = {enable_thinking = false, name = \"x\"}\n")
    assert read_rl_file(str(tmp_path / "rl.toml")).data["chat_template_kwargs"] == (("enable_thinking", False),
                                                                                  ("name", "x"))
    got = parse_overrides(['data.chat_template_kwargs={"enable_thinking": true}'])
    assert got.data["chat_template_kwargs"] == (("enable_thinking", True),)
    with pytest.raises(RpegError, match="chat_template_kwargs must be a table of names to true/false, numbers or"):
        parse_overrides(["data.chat_template_kwargs=enable_thinking"])


def test_rl_settings_lists_every_setting_from_its_declaration(capsys):
    """`rpeg-run rl-settings` prints each RLConfig and DataConfig field with its default, range and help: the
    dataclasses and the bounds table declare them once."""
    import dataclasses

    from rpegc.core.ir.options import option_help
    from rpegc.runtime.backends.torch.rl.datasets import DataConfig
    from rpegc.runtime.backends.torch.rl.step import RLConfig
    from rpegc.runtime.cli import main

    assert main(["rl-settings"]) == 0
    out = capsys.readouterr().out
    for cls, prefix in ((RLConfig, ""), (DataConfig, "data.")):
        for f in dataclasses.fields(cls):
            assert option_help(f), f"{cls.__name__}.{f.name} has no help"
            assert f"  {prefix}{f.name} = " in out and option_help(f) in out
    assert "  lr_actor = 1e-06  (a number; > 0 and <= 1)" in out
    assert "  ppo_epochs = 1  (an integer; >= 1 and <= 1000)" in out
    assert '  data.truncation = "error"  (a string)' in out
