"""The generator writes exactly the DDL of a real nsys 2022.4 export."""

import re
import sqlite3

from nvtx_phases.analysis.synth.build import TABLES
from nvtxp_testkit import REPO, SAMPLES, SHARED


def test_vendored_ddl_is_the_shared_reference():
    for name in ("schema-2022.4.2.sql", "enums-2022.4.2.sql"):
        reference = SHARED / "nsys" / name
        if reference.exists():
            assert (
                REPO / "analysis" / "synth" / "schema" / f"nsys-{name}"
            ).read_bytes() == reference.read_bytes()


def test_sample_tables_match_reference_create_statements():
    ddl = (REPO / "analysis" / "synth" / "schema" / "nsys-schema-2022.4.2.sql").read_text()
    reference = dict(re.findall(r"CREATE TABLE (\w+) \((.*?)\n\);", ddl, flags=re.S))
    with sqlite3.connect(f"file:{SAMPLES / 'grpo_synthetic.sqlite'}?mode=ro", uri=True) as con:
        written = dict(
            con.execute("SELECT name, sql FROM sqlite_master WHERE type = 'table'").fetchall()
        )
    assert set(written) >= TABLES
    for name, sql in written.items():
        assert name in reference
        assert sql == f"CREATE TABLE {name} ({reference[name]}\n)"
