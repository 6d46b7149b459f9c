"""Files that are not one run are refused (or combined with a warning under --force-combine).

``check_combinable`` directly, on small captures and on real files (the synthetic split layout,
the two synthetic sample runs, two real H100 exports), and through the CLI.
"""

import json
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from nvtx_phases.analysis.cli import app
from nvtx_phases.analysis.errors import AnalysisError
from nvtx_phases.analysis.run.clocks import WINDOW_SLACK_NS, check_combinable
from nvtx_phases.analysis.run.load import load_trace
from nvtxp_testkit import SAMPLES, shared_trace
from typer.testing import CliRunner

S = 1_000_000_000
T0 = 1_790_000_000 * S  # 2026-09-21 14:13:20 UTC
FORCE_HINT = "; pass --force-combine to combine them anyway"
SPLIT = SAMPLES / "grpo_synthetic_split"
H100 = "nsysai_h100_2gpu_1s.sqlite"
H100_NCCL = "nsysai_mfu_2gpu_before.sqlite"


@dataclass
class Capture:
    path: Path
    label: str
    host: str
    session_start_utc_ns: int | None
    duration_ns: int | None
    pids: list[int] = field(default_factory=list)


def cap(name: str, start_s: float | None, duration_s: float | None, *pids: int, host="node0"):
    return Capture(
        path=Path(f"run/{name}.sqlite"),
        label=name,
        host=host,
        session_start_utc_ns=None if start_s is None else T0 + int(start_s * S),
        duration_ns=None if duration_s is None else int(duration_s * S),
        pids=list(pids),
    )


def check(*traces: Capture, force: bool = False) -> list[str]:
    return check_combinable(list(traces), force=force)


def refusal(*traces: Capture) -> str:
    with pytest.raises(AnalysisError) as caught:
        check(*traces)
    message = str(caught.value)
    assert "\n" not in message
    return message


# --- the rules, on small captures ------------------------------------------------------------


def test_one_file_and_staggered_per_process_reports_pass():
    assert check(cap("a", 0, 10, 1)) == []
    # one nsys session, one report per process, session starts a few ms apart
    assert check(cap("driver", 0, 100, 1), cap("w0", 0.003, 99, 2), cap("w1", 0.006, 99, 3)) == []


def test_windows_that_do_not_overlap_are_refused():
    assert refusal(cap("a", 0, 10, 1), cap("b", 3600, 20, 2)) == (
        "files of different runs: capture windows do not overlap: run/a.sqlite "
        "(2026-09-21 14:13:20 UTC, lasting 10.0 s), then 59.8 min later run/b.sqlite "
        "(2026-09-21 15:13:20 UTC, lasting 20.0 s)" + FORCE_HINT
    )


def test_a_chain_of_windows_is_one_run_and_the_slack_is_the_clock_skew():
    # workers that came and went, joined by the driver's window
    assert check(cap("driver", 0, 100, 1), cap("w0", 1, 40, 2), cap("w1", 60, 40, 3)) == []
    slack_s = WINDOW_SLACK_NS / S
    assert check(cap("a", 0, 10, 1), cap("b", 10 + slack_s, 10, 2)) == []
    just_past = Capture(Path("run/b.sqlite"), "b", "node0", T0 + 10 * S + WINDOW_SLACK_NS + 1, S)
    assert refusal(cap("a", 0, 10, 1), just_past) == (
        "files of different runs: capture windows do not overlap: run/a.sqlite "
        "(2026-09-21 14:13:20 UTC, lasting 10.0 s), then 10.0 ms later run/b.sqlite "
        "(2026-09-21 14:13:30 UTC, lasting 1.0 s)" + FORCE_HINT
    )


def test_several_stretches_are_named_in_time_order():
    message = refusal(
        cap("c", 7200, 5, 3), cap("a", 0, 10, 1), cap("b", 5, 10, 2), cap("d", 7201, 5, 4)
    )
    assert message == (
        "files of different runs: capture windows do not overlap: run/a.sqlite, run/b.sqlite "
        "(2026-09-21 14:13:20 UTC, lasting 15.0 s), then 119.8 min later run/c.sqlite, run/d.sqlite "
        "(2026-09-21 16:13:20 UTC, lasting 6.0 s)" + FORCE_HINT
    )


def test_one_process_in_two_files_at_once_is_refused():
    assert refusal(cap("a", 0, 10, 7, 8, 9), cap("b", 1, 10, 8, 9)) == (
        "files of different runs: run/a.sqlite and run/b.sqlite both hold process(es) 8, 9 of "
        "host node0 at the same time (the same capture given twice, or two runs that reuse "
        "these pids)" + FORCE_HINT
    )


def test_one_pid_at_different_times_or_on_different_hosts_passes():
    # a pid reused later in the run (or one process captured in two ranges): left to the windows
    assert check(cap("driver", 0, 100, 1), cap("w0", 0, 40, 5), cap("w1", 50, 40, 5)) == []
    # touching windows do not overlap
    assert check(cap("r0", 0, 10, 5), cap("r1", 10, 10, 5)) == []
    assert check(cap("a", 0, 10, 5, host="node0"), cap("b", 0, 10, 5, host="node1")) == []


def test_both_rules_in_one_line_windows_first():
    message = refusal(cap("a", 0, 10, 5), cap("b", 5, 10, 5), cap("c", 100, 10, 6))
    assert message == (
        "files of different runs: capture windows do not overlap: run/a.sqlite, run/b.sqlite "
        "(2026-09-21 14:13:20 UTC, lasting 15.0 s), then 85.0 s later run/c.sqlite "
        "(2026-09-21 14:15:00 UTC, lasting 10.0 s); run/a.sqlite and run/b.sqlite both hold "
        "process(es) 5 of host node0 at the same time (the same capture given twice, or two "
        "runs that reuse these pids)" + FORCE_HINT
    )


def test_force_turns_each_problem_into_a_warning():
    assert check(cap("a", 0, 10, 5), cap("b", 5, 10, 5), cap("c", 100, 10, 6), force=True) == [
        "combined anyway (--force-combine): capture windows do not overlap: run/a.sqlite, "
        "run/b.sqlite (2026-09-21 14:13:20 UTC, lasting 15.0 s), then 85.0 s later "
        "run/c.sqlite (2026-09-21 14:15:00 UTC, lasting 10.0 s)",
        "combined anyway (--force-combine): run/a.sqlite and run/b.sqlite both hold "
        "process(es) 5 of host node0 at the same time (the same capture given twice, or two "
        "runs that reuse these pids)",
    ]


def test_files_without_start_or_duration_are_warned_and_the_rest_checked():
    no_start, no_duration = cap("x", None, 10, 1), cap("y", 0, None, 1)
    warning = (
        "run/x.sqlite, run/y.sqlite: no session start time or capture duration "
        "(ANALYSIS_DETAILS): cannot check that they belong to the same run as the other files"
    )
    assert check(cap("a", 0, 10, 1), no_start, no_duration) == [warning]
    with pytest.raises(AnalysisError, match="capture windows do not overlap"):
        check(cap("a", 0, 10, 2), no_start, cap("b", 50, 10, 3))


# --- real files ----------------------------------------------------------------------------------


def loaded(*paths: Path) -> list:
    return [load_trace(p, p.stem) for p in paths]


def test_synthetic_split_files_are_one_run():
    traces = loaded(
        SPLIT / "driver.sqlite", SPLIT / "worker_rank0.sqlite", SPLIT / "worker_rank1.sqlite"
    )
    # staggered session starts (0, 3, 6 ms), windows ending together, one process per file
    assert [(t.session_start_utc_ns - T0, t.duration_ns, t.pids) for t in traces] == [
        (0, 198_252_270, [1000]),
        (3_000_000, 195_252_270, [2000]),
        (6_000_000, 192_252_270, [2001]),
    ]
    assert check_combinable(traces, force=False) == []


def test_the_two_sample_runs_are_refused_by_the_process_rule():
    a, b = SAMPLES / "grpo_synthetic.sqlite", SAMPLES / "grpo_synthetic_rm.sqlite"
    traces = loaded(a, b)
    # same session start, overlapping windows: only the process rule can tell them apart
    assert [(t.session_start_utc_ns, t.duration_ns, t.host, t.pids) for t in traces] == [
        (T0, 198_252_270, "synthetic", [1000, 2000, 2001]),
        (T0, 197_951_988, "synthetic", [1000, 2000, 2001]),
    ]
    with pytest.raises(AnalysisError) as caught:
        check_combinable(traces, force=False)
    assert str(caught.value) == (
        f"files of different runs: {a} and {b} both hold process(es) 1000, 2000, 2001 of host "
        "synthetic at the same time (the same capture given twice, or two runs that reuse "
        "these pids)" + FORCE_HINT
    )


def test_two_real_captures_two_days_apart_are_refused_by_the_window_rule():
    a, b = shared_trace(H100), shared_trace(H100_NCCL)
    traces = loaded(a, b)
    assert [(t.host, t.pids) for t in traces] == [("modal", [111, 112]), ("modal", [144, 145])]
    with pytest.raises(AnalysisError) as caught:
        check_combinable(traces, force=False)
    assert str(caught.value) == (
        f"files of different runs: capture windows do not overlap: {a} "
        f"(2026-05-24 13:40:14 UTC, lasting 4.9 min), then 42.2 h later {b} "
        "(2026-05-26 07:58:50 UTC, lasting 119.4 s)" + FORCE_HINT
    )


# --- through the CLI (needs check_combinable wired into analyze) ------------------------------


def test_cli_refuses_two_runs_in_one_line(tmp_path):
    a, b = SAMPLES / "grpo_synthetic.sqlite", SAMPLES / "grpo_synthetic_rm.sqlite"
    result = CliRunner().invoke(app, ["analyze", str(a), str(b), "--out", str(tmp_path / "x")])
    assert result.exit_code == 2, result.output
    assert result.stderr.splitlines() == [
        f"error: files of different runs: {a} and {b} both hold process(es) 1000, 2000, 2001 "
        "of host synthetic at the same time (the same capture given twice, or two runs that "
        "reuse these pids)" + FORCE_HINT
    ]


def test_cli_force_combine_analyzes_with_a_warning(tmp_path):
    a, b = SAMPLES / "grpo_synthetic.sqlite", SAMPLES / "grpo_synthetic_rm.sqlite"
    out = tmp_path / "x"
    result = CliRunner().invoke(
        app,
        ["analyze", str(a), str(b), "--out", str(out), "--force-combine", "-q", "--no-figures"],
    )
    assert result.exit_code == 0, result.output
    warning = (
        f"combined anyway (--force-combine): {a} and {b} both hold process(es) 1000, 2000, "
        "2001 of host synthetic at the same time (the same capture given twice, or two runs "
        "that reuse these pids)"
    )
    assert warning in json.loads((out / "summary.json").read_text())["warnings"]
    assert "warning: " + warning in " ".join(result.stdout.split())
