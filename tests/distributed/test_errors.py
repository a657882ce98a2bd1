"""Bad arguments: a TypeError or ValueError on the calling rank, naming the op and the argument,
raised before any collective (so no peer is left waiting)."""


EXPECTED_ERRORS = {
    "ag_dtype": ("TypeError", "opforge.distributed.all_gather_matmul: x_shard is torch.float32 but w is torch.float64"),
    "ag_k": ("ValueError", "x_shard has K=3 (its last dim) but w has K=5"),
    "ag_chunks": ("ValueError", "chunks must be a positive int or None, got 0"),
    "ag_variant": ("ValueError", "matmul_variant must be 'auto', None or one of ['triton_splitk'"),
    "rs_w_dims": ("ValueError", "opforge.distributed.matmul_reduce_scatter: w_shard must be 2-D [K, N]"),
    "rs_op": ("ValueError", "reduce_op must be 'sum' or 'avg', got 'max'"),
    "bcast_src": ("ValueError", "opforge.distributed.broadcast: src must be a rank of the group (0..1), got 2"),
    "bcast_type": ("TypeError", "opforge.distributed.broadcast: tensor must be a torch.Tensor, got list"),
    "gather_0d": ("ValueError", "opforge.distributed.all_gather: tensor must have at least 1 dim(s)"),
    "gather_sizes": ("ValueError", "sizes must hold 2 non-negative ints (one per rank), got [4]"),
    "shuffle_counts": ("ValueError", "opforge.distributed.shuffle_batch: counts sum to 2 but the partitions hold 4 rows"),
    "shuffle_float_counts": ("TypeError", "counts must be a 1-D integer tensor or a list of ints"),
    "shuffle_rows": ("ValueError", "column 'b' has 3 rows but the others have 4"),
}


def test_bad_arguments_raise_clear_errors_on_the_calling_rank(ranks2):
    for got in ranks2.run("bad_arguments"):
        for name, (kind, text) in EXPECTED_ERRORS.items():
            assert got[name][0] == kind and text in got[name][1], (name, got[name])
