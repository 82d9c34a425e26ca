"""pandas and pyarrow on dafne through fsspec, without a mount."""

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq


def frame(rows):
    rng = np.random.default_rng(12)
    return pd.DataFrame(
        {
            "id": np.arange(rows, dtype=np.int64),
            "x": rng.standard_normal(rows),
            "k": rng.integers(0, 1 << 40, rows),
            "s": [f"row-{i:08d}-{i * 7919 % 10007}" for i in range(rows)],
        }
    )


def test_a_parquet_round_trip_of_some_megabytes_with_pandas(cluster, fs, base):
    df = frame(300_000)
    url = "dafne://" + base + "/t.parquet"
    # Uncompressed, so the file is of some megabytes as written.
    df.to_parquet(url, storage_options={"cluster": cluster}, compression=None)
    size = fs.info(base + "/t.parquet")["size"]
    assert size > 8 << 20, size
    back = pd.read_parquet(url, storage_options={"cluster": cluster})
    pd.testing.assert_frame_equal(back, df)
    # A column and a row group: ranged reads of the file.
    ids = pd.read_parquet(url, storage_options={"cluster": cluster}, columns=["id"])
    assert ids["id"].tolist() == list(range(300_000))


def test_pyarrow_datasets_through_the_fsspec_handler(fs, base):
    table = pa.Table.from_pandas(frame(100_000), preserve_index=False)
    fs.mkdir(base + "/ds")
    pq.write_table(table, base + "/ds/part-0.parquet", filesystem=fs, row_group_size=10_000)
    pq.write_table(table.slice(0, 10), base + "/ds/part-1.parquet", filesystem=fs)
    meta = pq.ParquetFile(base + "/ds/part-0.parquet", filesystem=fs).metadata
    assert meta.num_rows == 100_000 and meta.num_row_groups == 10
    back = pq.read_table(base + "/ds", filesystem=fs)
    assert back.num_rows == 100_010
    assert back.column("id").to_pylist()[-10:] == list(range(10))
    pd.testing.assert_frame_equal(
        pq.read_table(base + "/ds/part-0.parquet", filesystem=fs).to_pandas(), table.to_pandas()
    )


def test_csv_with_pandas(cluster, base):
    df = frame(1000)
    url = "dafne://" + base + "/t.csv"
    df.to_csv(url, index=False, storage_options={"cluster": cluster})
    pd.testing.assert_frame_equal(pd.read_csv(url, storage_options={"cluster": cluster}), df)
