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

from ..errors import MissingDependency, WorkloadInputError

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


#: below this shape (σ) a lognormal has collapsed into a normal curve: loc → −∞, scale → ∞,
#: loc + scale ≈ the mean (rllm's outputs: σ 1.3e-5, loc −3.9e8); sampled, it goes negative
SIGMA_FLOOR = 1e-3
#: loc may lie at most this many data ranges (max − min) below the smallest value
LOC_MAX_RANGES = 10.0
#: the most a fitted CDF may miss the data's anywhere (one-sample KS statistic); PolyTrace's
#: own published fits reach 0.20
KS_MAX = 0.3


def lognorm_problems(values: np.ndarray, params: list[float], ks: float) -> list[str]:
    """Why a lognormal fit ``[shape, loc, scale]`` of ``values`` is degenerate (empty: it is not).

    Refused: a non-finite parameter or KS statistic, shape or scale ≤ 0, shape under
    :data:`SIGMA_FLOOR`, loc not below the smallest value (the data outside its support) or more
    than :data:`LOC_MAX_RANGES` data ranges below it, a KS statistic over :data:`KS_MAX`.
    """
    shape, loc, scale = params
    if not np.isfinite([shape, loc, scale, ks]).all():
        return ["a non-finite parameter or KS statistic"]
    problems = []
    if shape <= 0 or scale <= 0:
        problems.append(f"shape {shape:.3g} and scale {scale:.3g} must be > 0")
    elif shape < SIGMA_FLOOR:
        problems.append(
            f"sigma {shape:.2g} under the {SIGMA_FLOOR:g} floor, a normal curve in lognormal form"
        )
    low, high = float(values.min()), float(values.max())
    if loc >= low:
        problems.append(f"loc {loc:.4g} not below the smallest length {low:,.0f}")
    elif loc < low - LOC_MAX_RANGES * max(high - low, 1.0):
        problems.append(
            f"loc {loc:.3g} more than {LOC_MAX_RANGES:g}× the data's range "
            f"({low:,.0f}–{high:,.0f}) below its smallest value"
        )
    if ks > KS_MAX:
        problems.append(f"KS statistic {ks:.3f} over {KS_MAX:g}")
    return problems


def _lognorm(values: np.ndarray, **fixed: float) -> dict:
    """Scipy's lognorm fit (``fixed``: e.g. ``floc=0``) with its one-sample KS statistic."""
    stats = _scipy()
    params = [float(p) for p in stats.lognorm.fit(values, **fixed)]
    ks = stats.kstest(values, "lognorm", args=tuple(params))
    return {
        "type": "lognorm",
        "parameters": params,
        "ks_statistic": float(ks.statistic),
        "ks_p_value": float(ks.pvalue),
    }


def fit_lognorm(values: np.ndarray) -> dict:
    """Scipy's lognorm fit with its one-sample KS statistic and p-value, degenerate fits refused.

    A fit with :func:`lognorm_problems` is not written as the distribution: it goes under
    ``refused`` (parameters, KS, ``reason``) and the two-parameter fit (loc fixed at 0) is
    tried instead; when that is degenerate too, ``parameters`` (and KS) are null and
    ``refused`` lists both. :func:`refused_fit_lines` says what happened in one line.
    """
    values = np.asarray(values, dtype=float)
    first = _lognorm(values)
    problems = lognorm_problems(values, first["parameters"], first["ks_statistic"])
    if not problems:
        return first
    refused = [{**first, "reason": "; ".join(problems)}]
    second = _lognorm(values, floc=0.0)
    problems = lognorm_problems(values, second["parameters"], second["ks_statistic"])
    if not problems:
        return {**second, "loc_fixed": 0.0, "refused": refused}
    refused.append({**second, "loc_fixed": 0.0, "reason": "; ".join(problems)})
    return {
        "type": "lognorm",
        "parameters": None,
        "ks_statistic": None,
        "ks_p_value": None,
        "refused": refused,
    }


def refused_fit_lines(task: dict) -> list[str]:
    """One line per marginal of a fitted task whose lognormal fit was refused, with why."""
    lines = []
    for side in ("input", "output"):
        fit = task.get(f"{side}_distribution") or {}
        refused = fit.get("refused") or []
        if not refused:
            continue
        line = f"{side} lengths: lognormal fit refused: {refused[0]['reason']}"
        if fit.get("parameters") is not None:
            line += (
                f". Wrote the fit with loc fixed at 0 instead (sigma "
                f"{fit['parameters'][0]:.3g}, scale {fit['parameters'][2]:.4g}, KS "
                f"{fit['ks_statistic']:.3f})"
            )
        else:
            line += (
                f". The fit with loc fixed at 0 is refused too: {refused[-1]['reason']}. No "
                f"{side} distribution written (parameters null)"
            )
        lines.append(line)
    return lines


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
