"""Host-fed micro-batches: an Arrow record batch's numeric columns reach the device through pinned
staging (``records._arrow_column``) with the same values and dtypes as a plain conversion."""
import numpy as np
import pyarrow as pa
import torch

from opforge.stream.records import Batch


def test_arrow_batch_columns_equal_a_plain_conversion():
    rng = np.random.default_rng(3)
    n = 1000
    rb = pa.record_batch({
        "i8": pa.array(rng.integers(-100, 100, n).astype(np.int8)),
        "i32": pa.array(rng.integers(-2**31, 2**31 - 1, n).astype(np.int32)),
        "i64": pa.array(rng.integers(-2**62, 2**62, n)),
        "u8": pa.array(rng.integers(0, 255, n).astype(np.uint8)),
        "f32": pa.array(rng.standard_normal(n).astype(np.float32)),
        "f64": pa.array(rng.standard_normal(n)),
        "with_null": pa.array([1, None] * (n // 2)),
        "flag": pa.array(rng.random(n) < 0.5),
    })
    sliced = rb.slice(7, 900)  # offsets into the Arrow buffers
    for batch, src in ((Batch.from_arrow(rb, "cpu"), rb), (Batch.from_arrow(sliced, "cpu"), sliced),
                       (Batch.from_arrow(pa.Table.from_batches([rb.slice(0, 300), rb.slice(300)]), "cpu"), rb)):
        for name in ("i8", "i32", "i64", "u8"):
            want = torch.from_numpy(src.column(name).to_numpy().astype(np.int64))
            assert batch[name].dtype == torch.int64 and torch.equal(batch[name], want)
        for name in ("f32", "f64"):
            want = torch.from_numpy(src.column(name).to_numpy().astype(np.float64))
            assert batch[name].dtype == torch.float64 and torch.equal(batch[name], want)
        assert batch["with_null"] == src.column("with_null").to_pylist()
        assert batch["flag"].dtype == torch.bool and batch["flag"].tolist() == src.column("flag").to_pylist()
