"""Fit response-length distributions per task, check them, and sample synthetic step traces.

Parameters are written in PolyTrace's parameter-file layout: per task ``<task>_task`` with
``input_distribution`` / ``output_distribution`` (``type: lognorm``, ``parameters: [shape, loc,
scale]`` as scipy's ``lognorm.fit`` returns them, one-sample KS statistic and p-value) and a
``joint_distribution`` Gaussian mixture over (input, output) chosen by BIC (``gmm_parameters``:
weights, means, covariances). Sampling draws (input, output) pairs from the mixture, rounds and
clips them to at least 1 token (and to ``cap``), and writes ``packed_lengths_step_{S}.jsonl``.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import numpy as np
import polars as pl

from analysis.errors import AnalysisError


def _scipy():
    try:
        from scipy import stats
    except ImportError as exc:  # an optional extra: say how to get it
        raise AnalysisError(
            "length fits need scipy and scikit-learn: pip install nvtx-phases[fit]"
        ) from exc
    return stats


def fit_lognorm(values: np.ndarray) -> dict:
    """Scipy's lognorm fit with its one-sample KS statistic and p-value."""
    stats = _scipy()
    params = stats.lognorm.fit(values)
    ks = stats.kstest(values, "lognorm", args=params)
    return {
        "type": "lognorm",
        "parameters": [float(p) for p in params],
        "ks_statistic": float(ks.statistic),
        "ks_p_value": float(ks.pvalue),
    }


def fit_gmm(pairs: np.ndarray, *, max_components: int = 4, seed: int = 0) -> dict:
    """Gaussian mixture over (input, output) with the component count of lowest BIC."""
    _scipy()
    from sklearn.mixture import GaussianMixture

    best, best_bic = None, np.inf
    for k in range(1, min(max_components, len(pairs)) + 1):
        model = GaussianMixture(n_components=k, covariance_type="full", random_state=seed).fit(
            pairs
        )
        bic = model.bic(pairs)
        if bic < best_bic:
            best, best_bic = model, bic
    cov = np.cov(pairs, rowvar=False)
    corr = float(np.corrcoef(pairs, rowvar=False)[0, 1]) if len(pairs) > 1 else 0.0
    return {
        "joint_distribution": {
            "type": "gaussian_mixture",
            "n_components": int(best.n_components),
            "mean_vector": pairs.mean(axis=0).tolist(),
            "covariance_matrix": cov.tolist(),
            "correlation": corr,
            "bic_score": float(best_bic),
        },
        "gmm_parameters": {
            "weights": best.weights_.tolist(),
            "means": best.means_.tolist(),
            "covariances": best.covariances_.tolist(),
        },
    }


def fit_task(responses: pl.DataFrame, task: str = "task", *, seed: int = 0) -> dict:
    """All fits for one task's responses (``input_len``, ``output_len``), PolyTrace layout."""
    rows = responses.filter(~pl.col("validate")) if "validate" in responses.columns else responses
    if rows.height < 10:
        raise AnalysisError(f"too few responses to fit ({rows.height}; need at least 10)")
    inputs = rows["input_len"].to_numpy().astype(float)
    outputs = rows["output_len"].to_numpy().astype(float)
    return {
        "task_type": task,
        "description": f"response lengths of {rows.height} responses over {rows['step'].n_unique()} step(s)",
        "extraction_date": dt.datetime.now(dt.timezone.utc).isoformat(),
        "input_distribution": fit_lognorm(inputs),
        "output_distribution": fit_lognorm(outputs),
        **fit_gmm(np.column_stack([inputs, outputs]), seed=seed),
    }


def parameter_file(tasks: dict[str, dict], source: str) -> dict:
    """The whole parameter file: version, extraction info, one ``<task>_task`` entry per task."""
    return {
        "version": "1.0",
        "extraction_info": {"date": dt.datetime.now(dt.timezone.utc).isoformat(), "source": source},
        **{f"{name}_task": fit for name, fit in tasks.items()},
    }


def sample_pairs(task: dict, n: int, *, seed: int = 0, cap: int | None = None) -> np.ndarray:
    """``n`` (input, output) length pairs from the task's Gaussian mixture."""
    gmm = task["gmm_parameters"]
    rng = np.random.default_rng(seed)
    weights = np.asarray(gmm["weights"], dtype=float)
    components = rng.choice(len(weights), size=n, p=weights / weights.sum())
    pairs = np.empty((n, 2))
    for k in range(len(weights)):
        chosen = components == k
        if chosen.any():
            pairs[chosen] = rng.multivariate_normal(
                gmm["means"][k], gmm["covariances"][k], size=int(chosen.sum())
            )
    pairs = np.maximum(np.rint(pairs), 1)
    if cap is not None:
        pairs[:, 1] = np.minimum(pairs[:, 1], cap)
    return pairs.astype(np.int64)


def write_sampled_steps(
    task: dict,
    out: str | Path,
    *,
    steps: int,
    prompts: int,
    n_sampling: int,
    dp_size: int = 1,
    seed: int = 0,
    cap: int | None = None,
) -> list[Path]:
    """Synthetic ``packed_lengths_step_{S}.jsonl`` files (steps 1…``steps``) from a fitted task."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for step in range(1, steps + 1):
        pairs = sample_pairs(task, prompts * n_sampling, seed=seed + step, cap=cap)
        lines = []
        for p in range(prompts):
            block = pairs[p * n_sampling : (p + 1) * n_sampling]
            dp_rank = p * dp_size // prompts
            lines.append(
                json.dumps(
                    {
                        "step": step,
                        "rank": dp_rank,
                        "dp_rank": dp_rank,
                        "tp_rank": 0,
                        "local_index": p,
                        "input": int(block[0, 0]),
                        "output": [int(x) for x in block[:, 1]],
                        "n_sampling": n_sampling,
                        "validate": False,
                    }
                )
            )
        path = out / f"packed_lengths_step_{step}.jsonl"
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
        written.append(path)
    return written


def ks_two_sample(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    """Two-sample KS statistic and p-value (scipy)."""
    result = _scipy().ks_2samp(a, b)
    return float(result.statistic), float(result.pvalue)
