"""Adding the rows of one results folder to another's, each brought to the current schema: what
`tools/append_run.py` does, and what the merge of a multi-worker bench's parts writes with."""
from __future__ import annotations

import os
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from .. import schema

# What identifies a measured configuration besides the family's shape columns.
CONFIG_COLUMNS = ["op", "impl", "dtype", "precision", "sweep", "variant", "block", "num_warps"]


def _read(path: Path, family: str) -> pd.DataFrame:
    """A family's file with every column of the current schema: shape columns added since it was
    written take their defaults (`schema.with_added_columns`), the others are null."""
    return _with_all_columns(schema.with_added_columns(pd.read_parquet(path), family),
                             schema.family_schema(family))


def _with_all_columns(df: pd.DataFrame, arrow_schema: pa.Schema) -> pd.DataFrame:
    for name in arrow_schema.names:
        if name not in df:
            df[name] = None
    return df


def _table(df: pd.DataFrame, arrow_schema: pa.Schema) -> pa.Table:
    """df in the schema's columns, order and types (no pandas metadata, as the sweep's sink)."""
    df = _with_all_columns(df.copy(), arrow_schema)
    table = pa.Table.from_pandas(df[arrow_schema.names], schema=arrow_schema, preserve_index=False)
    return table.replace_schema_metadata(None)


def _concat(old: pd.DataFrame, new: pd.DataFrame, arrow_schema: pa.Schema) -> pa.Table:
    return pa.concat_tables([_table(old, arrow_schema), _table(new, arrow_schema)])


def write(table: pa.Table, path: Path) -> None:
    """Atomically (tmp + rename)."""
    tmp = path.with_suffix(".parquet.tmp")
    pq.write_table(table, tmp)
    os.replace(tmp, path)


def key_text(value) -> str:
    """A configuration value as text that two files agree on: a null (no block, no variant) is
    "", and a whole number the same whether its column came back as int or as float (with nulls)."""
    if value is None or (isinstance(value, float) and value != value):
        return ""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def repeated_configs(old: pd.DataFrame, new: pd.DataFrame, family: str) -> pd.DataFrame:
    """The rows of `new` whose configuration (op, impl, dtype, shape, sweep, path, block, warps)
    `old` already has."""
    keys = CONFIG_COLUMNS + list(schema.FAMILY_SHAPES[family])

    def as_keys(df):
        return df[keys].apply(lambda column: column.map(key_text))

    hit = as_keys(new).merge(as_keys(old).drop_duplicates(), on=keys, how="left", indicator=True)
    return new[(hit["_merge"] == "both").to_numpy()]


def merged_family(run: Path, into: Path, family: str) -> pa.Table:
    """INTO's rows of the family (none if it has no file) followed by RUN's; refused (ValueError)
    where RUN's rows are already there."""
    source, target = run / f"{family}.parquet", into / f"{family}.parquet"
    new = _read(source, family)
    old = _read(target, family) if target.exists() else new.iloc[:0]
    if set(new["run_id"]) & set(old["run_id"]):
        raise ValueError(f"{target} already holds rows of run {sorted(set(new['run_id']))}")
    repeated = repeated_configs(old, new, family)
    if len(repeated):
        first = repeated.iloc[0]
        raise ValueError(f"{len(repeated)} rows of {source} repeat configurations {target} "
                         f"already has (e.g. {first['op']} {first['impl']} {first['dtype']}); "
                         "remove the old rows first if they are to be replaced")
    return _concat(old, new, schema.family_schema(family))


def merged_by_run(run: Path, into: Path, name: str = "limits") -> pa.Table:
    """INTO's limits (or run records, name "runs") followed by those of RUN's runs that INTO does
    not have yet."""
    arrow_schema = schema.limits_schema() if name == "limits" else schema.runs_schema()
    new = pd.read_parquet(run / f"{name}.parquet")
    target = into / f"{name}.parquet"
    old = pd.read_parquet(target) if target.exists() else new.iloc[:0]
    return _concat(old, new[~new["run_id"].isin(set(old["run_id"]))], arrow_schema)


def append_run(run: Path, into: Path) -> dict[str, int]:
    """Every family file of RUN, then its limits; the rows each file of INTO gained. Every family
    is checked before any file is written, so a refusal leaves INTO as it was."""
    run, into = Path(run), Path(into)
    families = [f for f in schema.FAMILY_SHAPES if (run / f"{f}.parquet").exists()]
    if not families or not (run / "limits.parquet").exists():
        raise FileNotFoundError(f"{run} holds no family's rows and limits.parquet to append")
    merged = {f: merged_family(run, into, f) for f in families}
    merged["limits"] = merged_by_run(run, into)
    if (run / "runs.parquet").exists():  # runs from before run records have none
        merged["runs"] = merged_by_run(run, into, "runs")
    added = {}
    for name, table in merged.items():
        target = into / f"{name}.parquet"
        before = pq.read_metadata(target).num_rows if target.exists() else 0
        write(table, target)
        added[name] = table.num_rows - before
    return added

