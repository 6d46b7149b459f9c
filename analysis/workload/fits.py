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
from typing import Any

import numpy as np
import polars as pl

from analysis.errors import MissingDependency, WorkloadInputError

#: how to get what the fits need (an optional extra: scipy and scikit-learn, ~200 MB installed)
FIT_HINT = "pip install 'nvtx-phases[fit]'"


def missing_fit_dependencies() -> list[str]:
    """Names of the packages the fits need that cannot be imported (empty: fits work)."""
    missing = []
    for module, package in (("scipy.stats", "scipy"), ("sklearn.mixture", "scikit-learn")):
        try:
            __import__(module)
        except ImportError:
            missing.append(package)
    return missing


def _scipy() -> Any:
    try:
        from scipy import stats
    except ImportError as exc:  # an optional extra: say how to get it
        raise MissingDependency(f"length fits need scipy and scikit-learn: {FIT_HINT}") from exc
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
    try:
        from sklearn.mixture import GaussianMixture
    except ImportError as exc:
        raise MissingDependency(f"length fits need scipy and scikit-learn: {FIT_HINT}") from exc

    best, best_bic = None, np.inf
    for k in range(1, min(max_components, len(pairs)) + 1):
        model = GaussianMixture(n_components=k, covariance_type="full", random_state=seed).fit(
            pairs
        )
        bic = model.bic(pairs)
        if bic < best_bic:
            best, best_bic = model, bic
    if best is None:  # no pairs, or no component count gave a finite BIC
        raise WorkloadInputError(f"no Gaussian mixture fits these {len(pairs)} length pair(s)")
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
        raise WorkloadInputError(f"too few responses to fit ({rows.height}; need at least 10)")
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


def read_parameter_file(path: str | Path) -> dict[str, dict]:
    """The tasks of a parameter file that carry a mixture to sample from, by task name.

    Raises :class:`~analysis.errors.WorkloadInputError` for a file that is not JSON, not a parameter file, or has no
    task with ``gmm_parameters``; each task's mixture is checked by :func:`gmm_arrays`.
    """
    path = Path(path)
    text = path.read_text(encoding="utf-8", errors="replace")  # OSError: the CLI's one line
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise WorkloadInputError(f"{path}: not a JSON parameter file ({exc})") from exc
    if not isinstance(data, dict):
        raise WorkloadInputError(
            f"{path}: not a parameter file (a JSON object of <task>_task entries)"
        )
    tasks = {
        key.removesuffix("_task"): value
        for key, value in data.items()
        if key.endswith("_task") and isinstance(value, dict) and "gmm_parameters" in value
    }
    if not tasks:
        raise WorkloadInputError(f"{path}: no task with gmm_parameters")
    for name, task in tasks.items():
        try:
            gmm_arrays(task)
        except WorkloadInputError as exc:
            raise WorkloadInputError(f"{path}: task '{name}': {exc}") from None
    return tasks


def gmm_arrays(task: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(weights, means, covariances) of a task's mixture, checked.

    k weights ≥ 0 summing to more than 0, k means of (input, output), k symmetric positive
    semi-definite 2×2 covariances, all finite; else :class:`~analysis.errors.WorkloadInputError`.
    """
    gmm = task.get("gmm_parameters")
    if not isinstance(gmm, dict) or not {"weights", "means", "covariances"} <= set(gmm):
        raise WorkloadInputError("gmm_parameters needs weights, means and covariances")
    try:
        weights = np.asarray(gmm["weights"], dtype=float)
        means = np.asarray(gmm["means"], dtype=float)
        covs = np.asarray(gmm["covariances"], dtype=float)
    except (TypeError, ValueError) as exc:
        raise WorkloadInputError(f"gmm_parameters are not arrays of numbers ({exc})") from None
    k = weights.shape[0] if weights.ndim == 1 else -1
    if k < 1 or means.shape != (k, 2) or covs.shape != (k, 2, 2):
        raise WorkloadInputError(
            "gmm_parameters need k weights, k means of 2 and k 2×2 covariances; got shapes "
            f"{weights.shape}, {means.shape}, {covs.shape}"
        )
    if not (np.isfinite(weights).all() and np.isfinite(means).all() and np.isfinite(covs).all()):
        raise WorkloadInputError("gmm_parameters hold a non-finite number")
    if (weights < 0).any() or weights.sum() <= 0:
        raise WorkloadInputError("gmm weights must be ≥ 0 and sum to more than 0")
    if (
        not np.allclose(covs, covs.transpose(0, 2, 1))
        or (np.linalg.eigvalsh(covs).min(axis=1) < -1e-9 * np.abs(covs).max(axis=(1, 2))).any()
    ):
        raise WorkloadInputError("a gmm covariance is not symmetric positive semi-definite")
    return weights, means, covs


def sample_pairs(task: dict, n: int, *, seed: int = 0, cap: int | None = None) -> np.ndarray:
    """``n`` (input, output) length pairs from the task's Gaussian mixture."""
    weights, means, covs = gmm_arrays(task)
    rng = np.random.default_rng(seed)
    components = rng.choice(len(weights), size=n, p=weights / weights.sum())
    pairs = np.empty((n, 2))
    for k in range(len(weights)):
        chosen = components == k
        if chosen.any():
            pairs[chosen] = rng.multivariate_normal(means[k], covs[k], size=int(chosen.sum()))
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
