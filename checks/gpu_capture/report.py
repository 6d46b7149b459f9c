"""Output of the import step: the checks table and phase table (terminal, Markdown), the verdict."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from checks.gpu_capture.model import DRY_NOTICE
from checks.gpu_check.model import FAIL, INFO, PASS, SKIP


def verdict(data: dict[str, Any]) -> str:
    """The one line that says how it went (a dry run says so first)."""
    checks = data["checks"]
    failed = [f"[{c['key']}] {c['name']}" for c in checks if c["status"] == FAIL]
    gated = sum(c["status"] in (PASS, FAIL) for c in checks)
    skipped = sum(c["status"] == SKIP for c in checks)
    head = f"{DRY_NOTICE} ({data['dry_reason']}); " if data["dry"] else "gpu_capture: "
    if failed:
        return f"{head}FAIL: {'; '.join(failed)}"
    return f"{head}PASS: {gated} checks passed, {skipped} not run"


def markdown(data: dict[str, Any]) -> str:
    """``gpu_capture.md``: verdict, checks, the driver's phases per mode."""
    cell = lambda text: str(text).replace("|", "\\|")  # noqa: E731
    lines = ["# GPU capture check" + (" (DRY RUN, CPU)" if data["dry"] else ""), ""]
    lines += [
        f"**{verdict(data)}**",
        "",
        "| capture | check | result | detail |",
        "|---|---|---|---|",
    ]
    lines += [
        f"| {c['key']} | {cell(c['name'])} | {c['status']} | {cell(c['detail'])} |"
        for c in data["checks"]
    ]
    for mode, rows in data["phases"].items():
        if not rows:
            continue
        keys = list(rows[0])
        lines += ["", f"## Driver phases, median over steps ({mode} capture)", ""]
        lines += ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
        lines += ["| " + " | ".join("—" if r[k] is None else str(r[k]) for k in keys) + " |"
                  for r in rows]  # fmt: skip
    return "\n".join(lines) + "\n"


def print_report(data: dict[str, Any]) -> None:
    """Phase tables and the checks table on the terminal, then the verdict."""
    console = Console(width=160)
    for mode, rows in data["phases"].items():
        if rows:
            table = Table(title=f"driver phases, median over steps ({mode} capture)")
            for key in rows[0]:
                table.add_column(key, justify="right")
            for r in rows:
                table.add_row(*("—" if v is None else str(v) for v in r.values()))
            console.print(table)
    checks = Table(title="checks" + (" (DRY RUN)" if data["dry"] else ""))
    for header in ("capture", "check", "result", "detail"):
        checks.add_column(header, overflow="fold")
    style = {PASS: "green", FAIL: "bold red", INFO: "cyan", SKIP: "yellow"}
    for c in data["checks"]:
        checks.add_row(c["key"], escape(c["name"]), f"[{style[c['status']]}]{c['status']}[/]",
                       escape(c["detail"]))  # fmt: skip
    console.print(checks)
    console.print(verdict(data), style="bold green" if data["passed"] else "bold red",
                  highlight=False, markup=False)  # fmt: skip
