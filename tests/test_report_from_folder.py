"""A report drawn from an analysis folder reuses its power envelope table instead of recomputing it."""

from pathlib import Path

import polars as pl
from nvtx_phases.analysis.energy import envelope as envelope_module
from nvtx_phases.analysis.jobs.run import analyze_to, build_report
from nvtx_phases.analysis.render.figures.envelope import CSV_NAME
from PIL import Image

SAMPLE = "traces_sample/grpo_synthetic.sqlite"


def test_report_from_a_folder_draws_the_saved_envelope(tmp_path, monkeypatch):
    folder = tmp_path / "run"
    analyze_to([Path(SAMPLE)], folder)
    saved = pl.read_csv(folder / CSV_NAME)
    assert saved.height > 0

    def recompute(*args, **kwargs):
        raise AssertionError("the envelope was recomputed although the folder holds it")

    monkeypatch.setattr(envelope_module, "power_envelope", recompute)
    build_report([folder], tmp_path / "report")
    figure = tmp_path / "report" / "figures" / "power_envelope.png"
    assert figure.exists()
    assert Image.open(figure).size == (1600, 1400)
    assert not (tmp_path / "report" / CSV_NAME).exists()  # a table only where it was computed
