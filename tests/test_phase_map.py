import importlib.util
import os
import re
from pathlib import Path

import polars as pl
import pytest
from nvtx_phases.analysis.attribute.phase_map import default_phase_map, load_phase_map
from nvtx_phases.analysis.run.pipeline import analyze
from nvtxp_testkit import SAMPLES

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
    assert out["canonical"].to_list() == names  # VeRL's colocated labels keep their names
    # only the async trainer's and rollouter's keyed timers are renamed (they hold a "/")
    assert dict(pm.rename) == {
        "timing_s/param_sync": "param_sync",
        "rollouter/validate_time": "validate",
    }


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


# --- pattern rules and argument stripping ---------------------------------------------------------


def _map(tmp_path, text: str):
    path = tmp_path / "phases.toml"
    path.write_text(text)
    return load_phase_map(path)


def _read(pm, names: list[str], domains: list[str] | None = None) -> list[tuple[bool, str]]:
    frame = pl.DataFrame({"name": names, "domain": domains or [""] * len(names)})
    out = frame.select(pm.name(pl.col("name")).alias("name"), pl.col("domain")).select(
        pm.is_phase(pl.col("name"), pl.col("domain")).alias("phase"),
        pm.canonical(pl.col("name")).alias("canonical"),
    )
    return list(zip(out["phase"].to_list(), out["canonical"].to_list(), strict=True))


def test_rules_match_globs_and_regexes_in_order_after_exact_names(tmp_path):
    pm = _map(
        tmp_path,
        """
[rename]
compute_values = "values_renamed"
[[rule]]
regex = "^compute_.*_log_prob$"
phase = "log_prob"
[[rule]]
match = "aten::*"
[[rule]]
match = "aten::m?"
phase = "never"          # an earlier rule matches aten::mm first
[[rule]]
match = "[!a-z]*_chunk"
phase = "chunk"
""",
    )
    names = [
        "compute_log_prob",  # an exact default name: kept, even though the regex matches
        "compute_ref_log_prob",  # exact too
        "compute_actor_log_prob",  # regex
        "compute_log_probs",  # neither: the regex is anchored
        "x_compute_a_log_prob",  # neither
        "aten::mm",  # glob, own name
        "Aten::mm",  # globs are case-sensitive
        "compute_values",  # exact rename wins over everything
        "Rollout_chunk",  # character class
        "rollout_chunk",  # excluded by [!a-z]
        "gen",  # exact default
    ]
    assert _read(pm, names) == [
        (True, "compute_log_prob"),
        (True, "compute_ref_log_prob"),
        (True, "log_prob"),
        (False, "compute_log_probs"),
        (False, "x_compute_a_log_prob"),
        (True, "aten::mm"),
        (False, "Aten::mm"),
        (True, "values_renamed"),
        (True, "chunk"),
        (False, "rollout_chunk"),
        (True, "gen"),
    ]
    # a range of the nvtx_phases domain is a phase anyway; a rule still names it
    assert _read(pm, ["aten::add", "other"], ["nvtx_phases", "nvtx_phases"]) == [
        (True, "aten::add"),
        (True, "other"),
    ]
    # with --all-ranges every range is a phase; rules still give the phase name
    assert _read(pm.with_all_ranges(), ["compute_x_log_prob", "zzz"]) == [
        (True, "log_prob"),
        (True, "zzz"),
    ]


@pytest.mark.parametrize("pattern", ["aten::*", "*mm*", "?a*", "[ab]*", "[!a]*", "*[*]*", "a.b*"])
def test_glob_rules_match_what_fnmatchcase_matches(tmp_path, pattern):
    import fnmatch

    names = ["aten::mm", "aten::add_", "Aten::mm", "bmm", "a.bc", "axbc", "x*y", "", "ab\nc"]
    pm = _map(tmp_path, f'use_defaults = false\n[[rule]]\nmatch = "{pattern}"\n')
    got = [phase for phase, _ in _read(pm, names)]
    assert got == [fnmatch.fnmatchcase(n, pattern) for n in names]


def test_rules_drive_the_analysis_and_can_name_the_step(tmp_path):
    pm = _map(
        tmp_path,
        """
use_defaults = false
step_names = ["iteration"]
[[rule]]
regex = "^compute_.*log_prob$"
phase = "log_prob"
[[rule]]
match = "st?p"
phase = "iteration"      # a step name: these ranges mark the steps
[[rule]]
match = "generate_*"
phase = "rollout"
""",
    )
    result = analyze([SAMPLES / "grpo_synthetic.sqlite"], phase_map=pm)
    paths = result.phases.group_by("path", "phase").len().sort("path", "phase").rows()
    assert paths == [
        ("iteration", "step", 3),
        ("log_prob", "compute_log_prob", 6),
        ("log_prob", "compute_ref_log_prob", 6),
        ("rollout", "generate_sequences", 6),
    ]
    assert set(result.phases["step"]) == {1, 2, 3}


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ('[[rule]]\nmatch = "a*"\nregex = "a"\n', "exactly one of 'match' (glob) or 'regex'"),
        ('[[rule]]\nphase = "x"\n', "exactly one of 'match' (glob) or 'regex'"),
        ('[[rule]]\nregex = "("\n', "[[rule]] #1: regex '(' is not valid"),
        ('[[rule]]\nmatch = "a*"\nname = "x"\n', "[[rule]] #1: unknown key(s) name"),
        ('[[rule]]\nmatch = ""\n', "'match' must be a non-empty string"),
        ('[[rule]]\nmatch = "a"\n[[rule]]\nmatch = "b"\nphase = 3\n', "#2: 'phase' must be"),
        ('rule = "aten::*"\n', "'rule' must be [[rule]] tables"),
        ("strip_args = 1\n", "'strip_args' must be true or false"),
    ],
)
def test_bad_rules_are_one_line_phase_map_errors(tmp_path, text, says):
    from nvtx_phases.analysis.errors import PhaseMapError

    with pytest.raises(PhaseMapError) as caught:
        _map(tmp_path, text)
    assert says in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.parametrize(
    ("name", "stripped"),
    [
        ("aten::mm, op_id = 12", "aten::mm"),
        ("aten::detach_, seq = 45328, op_id = 990724", "aten::detach_"),
        ("detach_, op_id = 990725", "detach_"),
        ("aten::mm, op_id = 3, sizes = [[2, 3], [3, 4]], input_op_ids = [(1, 0)]", "aten::mm"),
        ("aten::mm", "aten::mm"),
        ("a, b", "a, b"),  # no ", key = "
        ("a,b = 1", "a,b = 1"),  # no space after the comma
        ("a, b=1", "a, b=1"),  # no spaces around =
        ("a, 1x = 2", "a, 1x = 2"),  # not an identifier
        (", op_id = 1", ", op_id = 1"),  # would become empty: kept
        ("x, y, op_id = 1", "x, y"),
        ("", ""),
    ],
)
def test_strip_args_cuts_at_the_first_key_value_suffix(tmp_path, name, stripped):
    plain = default_phase_map().with_all_ranges()
    assert _read(plain.with_strip_args(), [name]) == [(True, stripped)]
    assert _read(plain, [name]) == [(True, name)]
    from_file = _map(tmp_path, "strip_args = true\n")
    assert from_file.strip_args and _read(from_file.with_all_ranges(), [name]) == [(True, stripped)]


@pytest.mark.parametrize(
    ("trace", "rows", "stripped_rows", "ranges", "names"),
    [
        ("nsysai_h100_2gpu_1s.sqlite", 16782, 1022, 16782, 352),
        ("nsysai_mfu_2gpu_before.sqlite", 18986, 553, 19118, 186),
    ],
)
def test_strip_args_groups_real_pytorch_ranges(trace, rows, stripped_rows, ranges, names):
    """Real exports of PyTorch's emit_nvtx ranges (``aten::mm, op_id = N``, ``seq = …``)."""
    import sqlite3

    from nvtxp_testkit import shared_trace

    path = shared_trace(trace)
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as con:
        raw = con.execute(
            "SELECT e.globalTid, coalesce(e.text, s.value) FROM NVTX_EVENTS e "
            "LEFT JOIN StringIds s ON e.textId = s.id WHERE e.eventType = 59"
        ).fetchall()
    # independently: the pid is bits 24..47 of the global thread id, the name before ", "
    expected = {((gtid >> 24) & 0xFFFFFF, text.split(", ")[0]) for gtid, text in raw}
    assert len(raw) == ranges and len(expected) == names

    every = default_phase_map().with_all_ranges()
    plain = analyze([path], phase_map=every)
    stripped = analyze([path], phase_map=every.with_strip_args())
    assert plain.phases.height == rows and stripped.phases.height == stripped_rows
    assert set(stripped.phases.select("pid", "phase").iter_rows()) == expected
    assert not stripped.phases["phase"].str.contains("op_id").any()
    assert plain.phases["n_ranges"].sum() == stripped.phases["n_ranges"].sum() == ranges
    # the names change, the GPU time attributed does not
    assert plain.summary.gpu == stripped.summary.gpu
    top = pl.col("level") == 0
    assert (
        plain.phases.filter(top)["kernel_ns"].sum()
        == stripped.phases.filter(top)["kernel_ns"].sum()
    )


def test_cli_strip_args(tmp_path):
    from nvtx_phases.analysis.cli import app
    from nvtxp_testkit import shared_trace
    from typer.testing import CliRunner

    path = shared_trace("nsysai_h100_2gpu_1s.sqlite")
    args = ["analyze", str(path), "--all-ranges", "--no-figures", "-q", "--out"]
    result = CliRunner().invoke(app, [*args, str(tmp_path / "s"), "--strip-args"])
    assert result.exit_code == 0, result.output
    assert pl.read_parquet(tmp_path / "s" / "phases.parquet").height == 1022
