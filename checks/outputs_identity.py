"""Every command's outputs hashed, so a refactor can show it changed none of them.

Runs every command on the bundled sample, a Ray-style capture, the VeRL CPU run and the real
exports in ../shared/traces and hashes every file written; ``--compare BEFORE.tsv AFTER.tsv``
lists the files that differ.

Run a checkout's code with ``--pythonpath`` (e.g. a ``git worktree`` of the older commit); the
files it writes go under ``--out``, the manifest to ``--out/manifest.tsv``. Lines that name the
time of the run or the output folder are masked before hashing, so two runs of the same code
give the same manifest.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import subprocess
import sys
from pathlib import Path

SHARED = Path(__file__).resolve().parents[2] / "shared"

# (label, argv after `nvtx-phases`); {out} is the output folder, {sample} traces_sample/.
SAMPLE_COMMANDS: list[list[str]] = [
    ["analyze", "{sample}/grpo_synthetic.sqlite", "--out", "{out}/demo", "--max-rows", "40"],
    [
        "report",
        "{out}/demo",
        "--lengths",
        "{sample}/grpo_synthetic_lengths",
        "--cap",
        "4096",
        "--out",
        "{out}/demo",
    ],
    [
        "lengths",
        "analyze",
        "{sample}/grpo_synthetic_lengths",
        "--run",
        "{out}/demo",
        "--cap",
        "4096",
        "--no-fit",
        "--out",
        "{out}/demo/lengths",
    ],
    ["analyze", "{sample}/grpo_synthetic_split", "--out", "{out}/demo_split", "--quiet"],
    ["analyze", "{sample}/cpu_rl_step_nsys2022.4.sqlite", "--out", "{out}/demo_cpu"],
    ["report", "{sample}/cpu_rl_step_nsys2022.4.sqlite", "--out", "{out}/report_cpu"],
    [
        "compare",
        "{sample}/grpo_synthetic.sqlite",
        "{sample}/grpo_synthetic_rm.sqlite",
        "--label",
        "rule_reward",
        "--label",
        "reward_model",
        "--out",
        "{out}/compare",
    ],
    ["whatif", "{out}/demo", "--out", "{out}/whatif"],
    ["timeline", "{sample}/grpo_synthetic.sqlite", "--out", "{out}/timeline.json"],
    ["synth", "--ray", "{out}/ray_traces"],
    ["analyze", "{out}/ray_traces", "--out", "{out}/ray"],
    ["report", "{out}/ray", "--out", "{out}/ray"],
    ["whatif", "{out}/ray", "--out", "{out}/ray_whatif"],
    ["analyze", "tests/data/verl_cpu_run/verl_grpo.sqlite", "--out", "{out}/verl"],
    [
        "fidelity",
        "{out}/verl",
        "--log",
        "tests/data/verl_cpu_run/verl_console.log",
        "--out",
        "{out}/verl_fidelity",
    ],
    ["logs", "tests/data/verl_cpu_run/verl_console.log", "--out", "{out}/verl_logs"],
]

MASKS = [
    re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?([+-]\d\d:\d\d|Z)?"),
    re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d(:\d\d)?( UTC)?"),
    re.compile(r'"(elapsed|wall|duration)_s": [0-9.e-]+'),
]


def real_commands() -> list[list[str]]:
    """Analyze (+ --all-ranges) and report on every real export in ../shared/traces."""
    commands: list[list[str]] = []
    exports = sorted((SHARED / "traces").glob("*.sqlite"))
    exports += sorted((SHARED / "traces" / "wild").glob("*.sqlite"))
    for export in exports:
        name = export.stem
        commands.append(["analyze", str(export), "--out", "{out}/real/" + name, "--quiet"])
        commands.append(
            ["analyze", str(export), "--all-ranges", "--out", "{out}/real_all/" + name, "--quiet"]
        )
    return commands


def run_all(out: Path, pythonpath: str | None, repo: Path, module: str) -> None:
    """Run every command; a failing one is recorded (its exit status and stderr) and hashed too."""
    env = dict(os.environ)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    log = out / "commands.log"
    with log.open("w") as handle:
        for argv in SAMPLE_COMMANDS + real_commands():
            filled = [a.format(out=out, sample=repo / "traces_sample") for a in argv]
            result = subprocess.run(
                [sys.executable, "-m", "nvtx_phases.analysis.cli", *filled],
                cwd=repo,
                env=env,
                capture_output=True,
                text=True,
                check=False,
            )
            handle.write(f"$ nvtx-phases {' '.join(argv)}\nexit {result.returncode}\n")
            handle.write(mask(result.stderr, out, repo) + "\n")
            print(f"exit {result.returncode}: {' '.join(argv)}", flush=True)


def mask(text: str, out: Path, repo: Path | None = None) -> str:
    """Drop what differs between two runs of the same code: times, the output and repo folders."""
    text = text.replace(str(out), "{out}")
    if repo is not None:
        text = text.replace(str(repo), "{repo}")
    for pattern in MASKS:
        text = pattern.sub("<masked>", text)
    return text


def manifest(out: Path, repo: Path | None = None) -> dict[str, str]:
    """sha256 of every file under OUT (text files masked), by relative path."""
    digests: dict[str, str] = {}
    for path in sorted(out.rglob("*")):
        if not path.is_file() or path.name == "manifest.tsv":
            continue
        data = path.read_bytes()
        if path.suffix in {".csv", ".md", ".html", ".json", ".txt", ".log", ".tsv", ".svg"}:
            data = mask(data.decode("utf-8", "replace"), out, repo).encode()
        digests[str(path.relative_to(out))] = hashlib.sha256(data).hexdigest()
    return digests


def compare(before: Path, after: Path) -> int:
    """Print the files that differ, appear or disappear; exit status 1 when any does."""

    def read(path: Path) -> dict[str, str]:
        rows = (line.split("\t") for line in path.read_text().splitlines() if line)
        return {name: digest for name, digest in rows}

    old, new = read(before), read(after)
    changed = sorted(n for n in old.keys() & new.keys() if old[n] != new[n])
    gone, added = sorted(old.keys() - new.keys()), sorted(new.keys() - old.keys())
    same = len(old.keys() & new.keys()) - len(changed)
    print(f"{same} identical, {len(changed)} changed, {len(gone)} gone, {len(added)} new")
    for label, names in (("changed", changed), ("gone", gone), ("new", added)):
        for name in names:
            print(f"{label}\t{name}")
    return 1 if changed or gone or added else 0


def main() -> int:
    """Command line: run and hash, or compare two manifests."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="folder for the outputs and manifest.tsv")
    parser.add_argument("--pythonpath", help="PYTHONPATH for the commands (another checkout)")
    parser.add_argument("--repo", type=Path, default=Path.cwd(), help="checkout to run in")
    parser.add_argument(
        "--module", default="nvtx_phases.analysis.cli", help="the CLI module (older: analysis.cli)"
    )
    parser.add_argument(
        "--rehash", action="store_true", help="only hash what --out holds (no commands run)"
    )
    parser.add_argument("--compare", nargs=2, type=Path, metavar=("BEFORE", "AFTER"))
    args = parser.parse_args()
    if args.compare:
        return compare(*args.compare)
    if args.out is None:
        parser.error("--out is required unless --compare")
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    if not args.rehash:
        run_all(out, args.pythonpath, args.repo.resolve(), args.module)
    rows = manifest(out, args.repo.resolve())
    (out / "manifest.tsv").write_text("".join(f"{k}\t{v}\n" for k, v in rows.items()))
    print(f"{len(rows)} files hashed: {out / 'manifest.tsv'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
