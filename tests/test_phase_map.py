import importlib.util
import os
import re
from pathlib import Path

import polars as pl
import pytest
from nvtxp_testkit import SAMPLES

from analysis.attribute.phase_map import default_phase_map, load_phase_map
from analysis.run.pipeline import analyze
from nvtx_phases.naming import VERL_PROFILER_ROLES, VERL_TRAINER_PHASES


def test_default_map_knows_verl_names():
    pm = default_phase_map()
    frame = pl.DataFrame(
        {
            "name": ["gen", "compute_log_prob", "aten::mm", "x"],
            "domain": ["", "", "", "nvtx_phases"],
        }
    )
    assert frame.select(pm.is_phase(pl.col("name"), pl.col("domain")))["name"].to_list() == [
        True,
        True,
        False,
        True,
    ]


def test_toml_renames_and_extends(tmp_path):
    path = tmp_path / "phases.toml"
    path.write_text(
        'step_names = ["iteration"]\nphases = ["my_phase"]\n[rename]\ngenerate_sequences = "rollout"\n'
    )
    pm = load_phase_map(path)
    assert {"iteration", "step"} <= pm.step_names
    assert "my_phase" in pm.names and "rollout" in pm.names
    result = analyze([SAMPLES / "grpo_synthetic.sqlite"], phase_map=pm)
    rows = result.phases.filter(pl.col("phase") == "generate_sequences")
    assert set(rows["canonical"]) == {"rollout"} and set(rows["path"]) == {"rollout"}
    assert rows.height == 6  # 3 steps × 2 ranks


def test_toml_without_defaults(tmp_path):
    path = tmp_path / "phases.toml"
    path.write_text('use_defaults = false\nphases = ["gen"]\n')
    pm = load_phase_map(path)
    result = analyze([SAMPLES / "grpo_synthetic.sqlite"], phase_map=pm)
    assert set(result.phases["path"]) == {"step", "step/gen"}


def test_default_map_knows_verl_091_stage_labels_under_their_own_names():
    assert VERL_PROFILER_ROLES == (
        "actor_compute_log_prob",
        "ref_compute_log_prob",
        "actor_update",
        "train_batch",
        "forward_backward",
    )
    pm = default_phase_map()
    names = [
        *VERL_PROFILER_ROLES,
        "start_profile",
        "stop_profile",
        "dump_rollout_generations",
        "switch_to_trainer",
        "switch_wait",
        "switch_to_rollout",
        # the older method names stay phases too
        "compute_log_prob",
        "compute_ref_log_prob",
        "update_actor",
    ]
    frame = pl.DataFrame({"name": names, "domain": [""] * len(names)})
    out = frame.select(
        pm.is_phase(pl.col("name"), pl.col("domain")).alias("phase"),
        pm.canonical(pl.col("name")).alias("canonical"),
    )
    assert out["phase"].to_list() == [True] * len(names)
    assert out["canonical"].to_list() == names  # nothing renamed by default
    assert pm.rename == ()


def verl_source() -> Path:
    spec = importlib.util.find_spec("verl")
    if spec is None or not spec.submodule_search_locations:
        if os.environ.get("NVTX_PHASES_REQUIRE_VERL") == "1":
            pytest.fail("verl is required here (NVTX_PHASES_REQUIRE_VERL=1) but not installed")
        pytest.skip("verl not installed (pip install -e .[verl])")
    return Path(next(iter(spec.submodule_search_locations)))


def test_names_match_the_installed_verl_source():
    """The constants list exactly the labels the installed VeRL's source gives its ranges."""
    root = verl_source()
    roles = set()
    for path in sorted((root / "workers").rglob("*.py")):
        roles |= set(re.findall(r'DistProfiler\.annotate\([^)]*\brole="([^"]+)"', path.read_text()))
    assert roles == set(VERL_PROFILER_ROLES)

    timers = set()
    for path in (root / "trainer" / "ppo" / "ray_trainer.py", *(root / "trainer").rglob("v1/*.py")):
        text = path.read_text()
        timers |= set(re.findall(r'marked_timer\(\s*"([^"]+)"', text))
        if "marked_timer(str(Role.RefPolicy)" in text:
            timers.add("ref")  # str(Role.RefPolicy) == "ref"
    assert timers == set(VERL_TRAINER_PHASES) - {"gen_max"}  # gen_max: older releases only
