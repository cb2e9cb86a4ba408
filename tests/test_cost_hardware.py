"""Hardware profiles: the shipped TOML files load, and bad profiles are located RpegErrors at the key's
line and column in the profile (with its source line), naming the key, the value, the allowed range and the
cluster that asked for the profile. Also the cost-option parser."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from rpegc.core.cost.options import CostOptions, cost_options
from rpegc.core.ir.geometry import TIERS
from rpegc.core.ir.errors import Loc, RpegError, render
from rpegc.core.cost.hardware import PROFILE_DIR, Hardware, load_hardware, profile_names

CLUSTER_LOC = Loc("ppo.rpeg", 12, 1)
GOOD = (PROFILE_DIR / "gh200.toml").read_text()


def test_shipped_profiles():
    assert profile_names() == ["a100-40g", "cpu", "cpu-reference", "gh200", "h100-80g", "h200"]
    # cpu-reference: calibrated by rpeg-calibrate on this project's 2-core VM; `cpu` is this machine's profile, pinned
    # to cpu-reference in the suite (tests/conftest.py). No gpus_per_node: CPU worker processes, any number per node
    # (examples/ppo-tiny.rpeg runs 4).
    per_node = {"gh200": 4, "a100-40g": 8, "h100-80g": 8, "h200": 8, "cpu-reference": None}
    for name in profile_names():
        hw = load_hardware(name)
        assert hw.name == ("cpu-reference" if name == "cpu" else name) and hw.gpus_per_node == per_node[hw.name]
        assert hw.eps_rt == 0.10
        assert 0 < hw.M_eff < hw.M_GPU
        # Slower tiers never beat faster ones in a shipped profile.
        for alphas, betas in ((hw.alpha_coll, hw.beta_coll), (hw.alpha_p2p, hw.beta_p2p)):
            assert list(alphas) == sorted(alphas) and list(betas) == sorted(betas)
    gh = load_hardware("gh200")
    assert gh.p2p("intra_node") == (8.0e-6, 6.25e-12)  # paper App. B: ~160 GB/s per GPU pair
    assert gh.M_GPU == 102e9
    assert load_hardware("a100-40g").M_GPU == 40 * 2**30


def test_every_shipped_value_cites_a_source():
    for path in PROFILE_DIR.glob("*.toml"):
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            code = line.split("#", 1)[0]
            if "=" in code and not code.strip().startswith(("name", "description")):
                assert "#" in line, f"{path.name}:{number} has no source comment"


def test_tier_lookup_by_name_and_index():
    import numpy as np

    hw = load_hardware("h100-80g")
    alphas, betas = hw.coll(np.array([0, 2, 1]))
    assert list(alphas) == [hw.alpha_coll[0], hw.alpha_coll[2], hw.alpha_coll[1]]
    assert hw.coll("inter_rack") == (hw.alpha_coll[2], hw.beta_coll[2])
    assert TIERS == ("intra_node", "inter_node", "inter_rack")


def test_load_by_path_relative_to_the_module(tmp_path: Path):
    (tmp_path / "my.toml").write_text(GOOD.replace('name = "gh200"', 'name = "mine"'))
    module = tmp_path / "ppo.rpeg"
    assert load_hardware("my.toml", Loc(str(module), 3, 1)).name == "mine"
    assert load_hardware(str(tmp_path / "my.toml")).source == str(tmp_path / "my.toml")


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    return str(path)


def error_of(path: str) -> RpegError:
    """The error of loading `path`: located in the profile, naming the cluster that asked for it."""
    with pytest.raises(RpegError) as info:
        load_hardware(path, CLUSTER_LOC)
    assert info.value.loc.file.endswith("bad.toml")
    assert "(the profile of the cluster at ppo.rpeg:12:1)" in info.value.message
    return info.value


def line_of(text: str, start: str) -> int:
    return next(i for i, l in enumerate(text.splitlines(), 1) if l.startswith(start))


def test_missing_key_is_located_at_its_table(tmp_path):
    text = GOOD.replace("BW_mem = 3.4e12", "")
    err = error_of(write(tmp_path, text))
    assert "missing key 'compute.BW_mem'" in err.message
    assert (err.loc.line, err.loc.col) == (text.splitlines().index('[compute]') + 1, 1)


def test_wrong_type_is_located_at_the_key(tmp_path):
    text = GOOD.replace("F_peak = 6.0e14", 'F_peak = "fast"')
    err = error_of(write(tmp_path, text))
    assert "key 'compute.F_peak' must be a number" in err.message
    assert err.loc.line == line_of(text, "F_peak")
    assert render(err, None).splitlines()[1].startswith('F_peak = "fast"')  # the profile's own line


def test_non_positive_value(tmp_path):
    err = error_of(write(tmp_path, GOOD.replace("beta = 6.25e-12", "beta = 0")))
    assert "key 'p2p.intra_node.beta' = 0.0 is outside the allowed range [1e-16, 0.001]" in err.message
    err = error_of(write(tmp_path, GOOD.replace("M_GPU = 102e9", "M_GPU = -1")))
    assert "key 'memory.M_GPU' = -1.0 is outside the allowed range (0, 1e+14]" in err.message
    err = error_of(write(tmp_path, GOOD.replace("eps_rt = 0.10", "eps_rt = 1.5")))
    assert "key 'memory.eps_rt' = 1.5 is outside the allowed range [0, 1)" in err.message


@pytest.mark.parametrize("old,new,key", [
    ("F_peak = 6.0e14", "F_peak = 1e300", "compute.F_peak"),
    ("F_peak = 6.0e14", "F_peak = 0", "compute.F_peak"),
    ("BW_mem = 3.4e12", "BW_mem = inf", "compute.BW_mem"),
    ("BW_mem = 3.4e12", "BW_mem = nan", "compute.BW_mem"),
    ("M_GPU = 102e9", "M_GPU = 1e300", "memory.M_GPU"),
    ("gamma_M = 256.0", "gamma_M = -1", "compute.gamma_M"),
    ("c_ng = 1.0e-3", "c_ng = 1e9", "compute.c_ng"),
    ("alpha = 1.0e-5", "alpha = 1e300", "collective.intra_node.alpha"),
    ("beta = 5.0e-12", "beta = 1e-300", "collective.intra_node.beta"),
])
def test_absurd_values_are_refused_with_the_allowed_range(tmp_path, old, new, key):
    text = GOOD.replace(old, new, 1)
    err = error_of(write(tmp_path, text))
    assert f"key '{key}' = " in err.message and "is outside the allowed range" in err.message
    assert "check the value and its unit" in err.message
    assert err.loc.line == line_of(text, new)


def test_overhead_table_is_optional_and_checked(tmp_path):
    hw = load_hardware(str(write(tmp_path, GOOD + "\n[overhead]\ngeneration_call = 1e-3\nnode = 3e-4\n")))
    assert (hw.overhead.generation_call, hw.overhead.node, hw.overhead.training_token) == (1e-3, 3e-4, 0.0)
    assert hw.overhead.call("generation") == 1e-3 and hw.overhead.token("inference") == 0.0
    text = GOOD + "\n[overhead]\nnode = -1\n"
    err = error_of(write(tmp_path, text))
    assert "key 'overhead.node' = -1.0 is outside the allowed range [0, 10]" in err.message
    assert err.loc.line == line_of(text, "node = -1")
    err = error_of(write(tmp_path, GOOD + "\n[overhead]\nlaunch = 1e-3\n"))
    assert "unknown key 'overhead.launch'" in err.message and "generation_call" in err.message
    # the round trip on a host with a core left is `node` unless the profile says otherwise
    assert (hw.overhead.node_free, hw.overhead.contention, hw.overhead.round_trip(False)) == (None, 0.0, 3e-4)
    both = load_hardware(str(write(tmp_path, GOOD + "\n[overhead]\nnode = 1e-3\nnode_free = 2e-4\n"
                                                     "contention = 5e-4\n"))).overhead
    assert (both.round_trip(True), both.round_trip(False), both.contention) == (1e-3, 2e-4, 5e-4)
    assert both.round_trip(np.array([True, False])).tolist() == [1e-3, 2e-4]
    err = error_of(write(tmp_path, GOOD + "\n[overhead]\ncontention = -1\n"))
    assert "key 'overhead.contention' = -1.0 is outside the allowed range" in err.message
    assert load_hardware(str(write(tmp_path, GOOD + "\n[overhead]\nco_run = 0.05\n"))).overhead.co_run == 0.05
    text = GOOD + "\n[overhead]\nco_run = -0.1\n"
    err = error_of(write(tmp_path, text))
    assert "key 'overhead.co_run' = -0.1 is outside the allowed range" in err.message
    assert err.loc.line == line_of(text, "co_run = -0.1")


def test_a_weights_transfer_costs_transfer_weights_where_the_profile_says_and_transfer_otherwise(tmp_path):
    plain = load_hardware(str(write(tmp_path, GOOD + "\n[overhead]\ntransfer = 3e-4\n"))).overhead
    assert plain.transfer_weights is None and plain.transfer_cost(True) == plain.transfer_cost(False) == 3e-4
    both = load_hardware(str(write(tmp_path, GOOD + "\n[overhead]\ntransfer = 3e-4\ntransfer_weights = 2e-3\n"))).overhead
    assert (both.transfer_cost(False), both.transfer_cost(True)) == (3e-4, 2e-3)
    assert both.transfer_cost(np.array([False, True])).tolist() == [3e-4, 2e-3]
    text = GOOD + "\n[overhead]\ntransfer_weights = 11\n"
    err = error_of(write(tmp_path, text))
    assert "key 'overhead.transfer_weights' = 11.0 is outside the allowed range [0, 10]" in err.message
    assert err.loc.line == line_of(text, "transfer_weights = 11")


@pytest.mark.parametrize("value", ["0", "-4", "100000", "2.5", '"four"'])
def test_gpus_per_node_out_of_range(tmp_path, value):
    text = GOOD.replace("gpus_per_node = 4 ", f"gpus_per_node = {value} ")
    err = error_of(write(tmp_path, text))
    assert "key 'gpus_per_node' = " in err.message and "must be an integer in [1, 1024]" in err.message
    assert err.loc.line == line_of(text, "gpus_per_node")


def test_cluster_with_more_gpus_per_node_than_its_profile(tmp_path):
    from rpegc.core.cost.hardware import cluster_hardware
    from rpegc.core.ir.geometry import Cluster

    path = write(tmp_path, GOOD.replace("gpus_per_node = 4 ", "gpus_per_node = 3 "))
    cluster = Cluster("c", 1, 2, 4, path, loc=CLUSTER_LOC)
    with pytest.raises(RpegError) as info:
        cluster_hardware(cluster)
    assert info.value.loc == CLUSTER_LOC
    assert "cluster @c has gpus = 4 per node, but its hardware profile" in info.value.message
    assert "gpus_per_node = 3; use at most 3 GPUs per node (gpus in [1, 3])" in info.value.message
    assert cluster_hardware(Cluster("c", 1, 2, 2, "gh200")).name == "gh200"  # a partial node is fine


def test_boolean_is_not_a_number(tmp_path):
    err = error_of(write(tmp_path, GOOD.replace("B_cal = 8", "B_cal = true")))
    assert "'compute.B_cal' must be a number" in err.message


def test_malformed_toml_is_located_at_the_line_and_column(tmp_path):
    text = GOOD.replace("[memory]", "[memory")
    err = error_of(write(tmp_path, text))
    assert "not valid TOML" in err.message and "(at line" not in err.message
    assert err.loc.line == text.splitlines().index('[memory') + 1


def test_profile_that_is_not_utf8_is_located_at_the_byte(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_bytes(GOOD.replace("estimate (NCCL", "estimate \xe9 (NCCL").encode("latin-1"))
    err = error_of(str(path))
    assert "not valid UTF-8" in err.message
    assert err.loc.line == line_of(GOOD, "alpha = 1.0e-5")


def test_profile_with_a_byte_order_mark_loads(tmp_path):
    path = tmp_path / "bom.toml"
    path.write_bytes(b"\xef\xbb\xbf" + GOOD.encode())
    assert load_hardware(str(path)).name == "gh200"


def test_missing_tier_and_unknown_keys(tmp_path):
    start = GOOD.index("[p2p.inter_rack]")
    with pytest.raises(RpegError) as info:  # nothing in the profile to point at: the cluster is the location
        load_hardware(write(tmp_path, GOOD[:start]), CLUSTER_LOC)
    assert info.value.loc == CLUSTER_LOC and "bad.toml': missing table [p2p.inter_rack]" in info.value.message
    err = error_of(write(tmp_path, GOOD.replace("gamma_M = 256.0", "gamma_m = 256.0\ngamma_M = 256.0")))
    assert "unknown key 'compute.gamma_m'" in err.message


def test_unknown_profile_name_lists_the_shipped_ones():
    with pytest.raises(RpegError) as info:
        load_hardware("tpu-v9", CLUSTER_LOC)
    assert info.value.loc == CLUSTER_LOC
    assert "unknown hardware profile 'tpu-v9'" in info.value.message and "gh200" in info.value.message


def test_unreadable_profile_path():
    with pytest.raises(RpegError, match="cannot read hardware profile"):
        load_hardware("/nonexistent/dir/x.toml", CLUSTER_LOC)


def test_from_dict_validates_like_a_file():
    with pytest.raises(RpegError, match="missing table \\[compute\\]"):
        Hardware.from_dict({"memory": {}})


def test_cost_options_from_user_values():
    opts = cost_options({"decode_rows": "local_batch", "bubble_on_generation": "false", "dp_scalar_allreduces": "3"})
    assert opts == CostOptions(decode_rows="local_batch", bubble_on_generation=False, dp_scalar_allreduces=3)
    loc = Loc("cmd", 1, 5)
    with pytest.raises(RpegError) as info:
        cost_options({"decode_rows": "everything"}, loc)
    assert info.value.loc == loc and "local_mb, local_batch" in info.value.message
    with pytest.raises(RpegError, match="unknown cost option 'decode'"):
        cost_options({"decode": "x"}, loc)
    with pytest.raises(RpegError, match="must be true or false"):
        cost_options({"bubble_on_generation": "maybe"}, loc)


def test_the_rope_and_recompute_keys_are_read_and_checked(tmp_path):
    """[compute] rope_* and [overhead] recompute_*: optional (0 where left out), read, and a negative one is an error
    located at its line."""
    text = GOOD.replace("[compute]\n", "[compute]\nrope_call = 3e-5\nrope_backward_element = 1.5e-9\n", 1)
    hw = load_hardware(str(write(tmp_path, text + "\n[overhead]\nrecompute_call = 4e-3\n")))
    assert (hw.rope_call, hw.rope_element, hw.rope_backward_element) == (3e-5, 0.0, 1.5e-9)
    assert (hw.overhead.recompute_call, hw.overhead.recompute_token) == (4e-3, 0.0)
    assert load_hardware("gh200").rope_call == 0.0 and load_hardware("gh200").overhead.recompute_call == 0.0
    bad = GOOD.replace("[compute]\n", "[compute]\nrope_element = -1e-9\n", 1)
    err = error_of(write(tmp_path, bad))
    assert "key 'compute.rope_element' = -1e-09 is outside the allowed range" in err.message
    assert err.loc.line == line_of(bad, "rope_element = -1e-9")
    bad = GOOD + "\n[overhead]\nrecompute_token = -1\n"
    err = error_of(write(tmp_path, bad))
    assert "key 'overhead.recompute_token' = -1.0 is outside the allowed range" in err.message


def test_the_speed_witnesses_are_optional_times(tmp_path):
    """[overhead] witness (a worker's, per operator) and [host] verify_witness (a pool process's), in seconds; left out,
    0 (no witness runs); a negative one is a located error."""
    assert "\n[host]\n" in GOOD and "[overhead]" not in GOOD
    hw = load_hardware(str(write(tmp_path, GOOD.replace("\n[host]\n", "\n[host]\nverify_witness = 3e-4\n")
                                 + "\n[overhead]\nwitness = 2e-4\n")))
    assert (hw.overhead.witness, hw.verify_witness) == (2e-4, 3e-4)
    plain = load_hardware(str(write(tmp_path, GOOD)))
    assert (plain.overhead.witness, plain.verify_witness) == (0.0, 0.0)
    text = GOOD + "\n[overhead]\nwitness = -1e-4\n"
    err = error_of(write(tmp_path, text))
    assert "key 'overhead.witness' = -0.0001 is outside the allowed range" in err.message
    assert err.loc.line == line_of(text, "witness = -1e-4")
