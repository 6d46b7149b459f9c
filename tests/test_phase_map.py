import polars as pl
from nvtxp_testkit import SAMPLES

from analysis.phase_map import default_phase_map, load_phase_map
from analysis.pipeline import analyze


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
