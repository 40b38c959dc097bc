"""inspector.stats.digest: one read of a part answers what filtering its rows would (numpy reference),
nulls, several chunks and missing groups included."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from inspector.stats.digest import digest


def table(seed: int, chunks: int, one_step: bool = False) -> pa.Table:
    """Random rows; ``one_step``: every row with a step at step 7 (a small part's usual case)."""
    rng = np.random.default_rng(seed)
    pieces = []
    for c in range(chunks):
        n = 50
        kinds = rng.choice(["forward", "gradient", None], n, p=[0.45, 0.45, 0.1])
        groups = rng.choice(["all", "positive", None] if c else ["positive", "negative"], n)
        pieces.append(pa.table({
            "step": pa.array(np.full(n, 7) if one_step else rng.integers(0, 20, n),
                             mask=rng.random(n) < 0.05),
            "tensor": pa.array(rng.choice(["a:0", "b:0"], n)).dictionary_encode(),
            "kind": pa.array(list(kinds), pa.string()).dictionary_encode(),
            "group": pa.array(list(groups), pa.string()).dictionary_encode(),
            "nan": pa.array(rng.choice([0, 0, 0, 3], n), mask=rng.random(n) < 0.05),
            "inf": pa.array(rng.choice([0, 0, 0, 0, 1], n)),
        }))
    return pa.concat_tables(pieces)


@pytest.mark.parametrize("seed,chunks,one_step", [(0, 1, False), (1, 3, False), (2, 2, False),
                                                (3, 3, True), (4, 1, True)])
def test_digest_equals_the_filtered_rows(seed, chunks, one_step):
    t = table(seed, chunks, one_step)
    d = digest(t)
    df = t.to_pandas()
    df = df.astype({c: object for c in ("kind", "group")})
    for kind in ("forward", "gradient"):
        for group in ("all", "positive", "negative"):
            rows = df[(df["kind"] == kind) & (df["group"] == group) & df["step"].notna()]
            want = np.unique(rows["step"].astype(np.int64))
            np.testing.assert_array_equal(d.steps.get((kind, group), np.zeros(0, np.int64)), want)
    assert set(d.steps) <= {(k, g) for k in ("forward", "gradient") for g in ("all", "positive", "negative")}
    np.testing.assert_array_equal(d.every, np.unique(df["step"].dropna().astype(np.int64)))
    bad = df[(df["group"] == "all") & df["step"].notna()
             & ((df["nan"].fillna(0) > 0) | (df["inf"] > 0))]
    assert d.nonfinite == ([(int(bad["step"].min()), int(bad["step"].max()))] if len(bad) else [])
    if chunks == 1:
        assert d.nonfinite == []   # the first chunk has no group 'all'


def test_an_empty_part_has_no_steps():
    d = digest(table(0, 1).slice(0, 0))
    assert d.steps == {} and len(d.every) == 0 and d.nonfinite == []
