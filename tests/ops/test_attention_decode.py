"""attention_decode: the split-KV Triton kernel under the interpreter (contiguous
and paged caches, GQA/MQA, causal new tokens, splits, LSE), NaN/empty/strided
inputs, errors, registry and dispatch, opcheck and torch.compile.

The oracle is torch in float64 written here, per sequence and per query token
over the keys it sees, never opforge itself; the caches are built here too
(paged: shuffled physical blocks, NaN in every slot no sequence owns).
"""

from __future__ import annotations

import pytest
import torch
from helpers import INTERPRETER_WARNINGS, rand

from opforge.bench.case import rel_err
from opforge.kernels import attention_decode as K
from opforge.ops import attention_decode as A
from opforge.ops.attention_decode import attention_decode
from opforge.runtime import dispatch, registry
from opforge.runtime.dispatch import force_variant

F16, BF16, F32, F64 = torch.float16, torch.bfloat16, torch.float32, torch.float64
BOUND = {F32: 1e-5, F16: 1e-3, BF16: 1e-2, F64: 1e-12}
TRITON = "triton_split_kv"

pytestmark = INTERPRETER_WARNINGS


# ---------------------------------------------------------------------------
# Inputs and the float64 oracle
# ---------------------------------------------------------------------------
def build(gen, B, Sq, Hq, H_kv, D, cap, lengths, dtype=F32, page=None):
    """q, a cache (contiguous, or paged with shuffled blocks), seqlens, the
    table (or None), and each sequence's live keys and values (float64)."""
    q = rand((B, Sq, Hq, D), gen, dtype)
    ks = [rand((n, H_kv, D), gen, dtype) for n in lengths]
    vs = [rand((n, H_kv, D), gen, dtype) for n in lengths]
    seqlens = torch.tensor(lengths, dtype=torch.int32)
    if page is None:
        kc = torch.full((B, cap, H_kv, D), float("nan"), dtype=dtype)
        vc = kc.clone()
        for b, n in enumerate(lengths):
            kc[b, :n], vc[b, :n] = ks[b], vs[b]
        table = None
    else:
        max_blocks = -(-cap // page)
        num_blocks = B * max_blocks + 2
        kc = torch.full((num_blocks, page, H_kv, D), float("nan"), dtype=dtype)
        vc = kc.clone()
        perm = torch.randperm(num_blocks, generator=gen)
        table = torch.full((B, max_blocks), -7, dtype=torch.int32)
        for b, n in enumerate(lengths):
            for j in range(-(-n // page)):
                phys = int(perm[b * max_blocks + j])
                table[b, j] = phys
                piece = slice(j * page, min(n, (j + 1) * page))
                kc[phys, : piece.stop - piece.start] = ks[b][piece]
                vc[phys, : piece.stop - piece.start] = vs[b][piece]
    return q, kc, vc, seqlens, table, [k.double() for k in ks], [v.double() for v in vs]


def oracle(q, ks, vs, scale):
    """float64: query i of sequence b sees its first len - Sq + i + 1 keys."""
    B, Sq, Hq, D = q.shape
    out = torch.zeros(B, Sq, Hq, D, dtype=F64)
    lse = torch.full((B, Hq, Sq), float("-inf"), dtype=F64)
    for b in range(B):
        n = ks[b].shape[0]
        G = Hq // ks[b].shape[1] if n else 1
        for i in range(Sq):
            seen = n - Sq + i + 1
            if seen <= 0:
                continue
            k = ks[b][:seen].repeat_interleave(G, dim=1)
            v = vs[b][:seen].repeat_interleave(G, dim=1)
            s = torch.einsum("hd,nhd->hn", q[b, i].double(), k) * scale
            out[b, i] = torch.einsum("hn,nhd->hd", torch.softmax(s, -1), v)
            lse[b, :, i] = torch.logsumexp(s, -1)
    return out, lse


def check(out, want, dtype):
    assert out.dtype == dtype and out.shape == want.shape
    err = rel_err(out, want)
    assert err <= BOUND[dtype], err


def run_kernel(q, kc, vc, seqlens, table, config, scale=None, lse=True):
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    return A.OP.variant(TRITON).run(config, q, kc, vc, seqlens, scale, lse, table)


# ---------------------------------------------------------------------------
# The Triton kernel against the oracle
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("heads", [(4, 4), (8, 4), (8, 2), (8, 1)], ids=["mha", "gqa2", "gqa4", "mqa"])
@pytest.mark.parametrize("dtype", [F32, F16], ids=str)
def test_contiguous_cache(dtype, heads, gen):
    Hq, H_kv = heads
    q, kc, vc, sl, _, ks, vs = build(gen, 3, 1, Hq, H_kv, 16, 70, [70, 1, 37], dtype)
    with force_variant("attention_decode", TRITON):
        out, lse = attention_decode(q, kc, vc, sl, scale=0.3, return_lse=True)
    want, want_lse = oracle(q, ks, vs, 0.3)
    check(out, want, dtype)
    check(lse, want_lse, F32)


@pytest.mark.parametrize("page,block_n", [(4, 16), (8, 32), (16, 16), (16, 32)],
                         ids=["p4-gather", "p8-gather", "p16-one-block-a-tile", "p16-gather"])
@pytest.mark.parametrize("sq", [1, 3])
def test_paged_cache(page, block_n, sq, gen):
    q, kc, vc, sl, table, ks, vs = build(gen, 3, sq, 8, 2, 32, 60, [60, 3, 29], F32, page=page)
    out, lse = run_kernel(q, kc, vc, sl, table, {"BLOCK_N": block_n, "SPLITS": 2})
    want, want_lse = oracle(q, ks, vs, 32 ** -0.5)
    check(out, want, F32)
    check(lse, want_lse, F32)


def test_paged_fp16_and_public_path(gen):
    q, kc, vc, sl, table, ks, vs = build(gen, 2, 2, 4, 2, 16, 40, [40, 17], F16, page=8)
    with force_variant("attention_decode", TRITON):
        out = attention_decode(q, kc, vc, sl, table)
    check(out, oracle(q, ks, vs, 0.25)[0], F16)


@pytest.mark.parametrize("page", [None, 4])
def test_new_tokens_attend_causally(page, gen):
    """Sq = 3 with lengths 1 and 2: the first queries see no key (0, -inf)."""
    q, kc, vc, sl, table, ks, vs = build(gen, 4, 3, 4, 2, 16, 20, [20, 1, 2, 3], F32, page=page)
    out, lse = run_kernel(q, kc, vc, sl, table, {"BLOCK_N": 16, "SPLITS": 2})
    want, want_lse = oracle(q, ks, vs, 0.25)
    check(out, want, F32)
    check(lse, want_lse, F32)
    assert bool((out[1, :2] == 0).all()) and bool((lse[1, :, :2] == float("-inf")).all())
    assert bool((out[2, 0] == 0).all()) and bool(torch.isfinite(lse[2, :, 1:]).all())


def test_query_rows_beyond_one_program(gen):
    """MQA with 16 heads x 5 new tokens: 80 rows, two programs of 64 rows per
    KV head (the second mostly padding); a length below Sq."""
    q, kc, vc, sl, table, ks, vs = build(gen, 2, 5, 16, 1, 16, 20, [20, 4], F32, page=4)
    assert K.split_programs(2, 16, 1, 5, 16, 1) == 4
    out, lse = run_kernel(q, kc, vc, sl, table, {"BLOCK_N": 16, "SPLITS": 2})
    want, want_lse = oracle(q, ks, vs, 0.25)
    check(out, want, F32)
    check(lse, want_lse, F32)


@pytest.mark.parametrize("page", [None, 8])
def test_several_splits_equal_one_split(page, gen):
    q, kc, vc, sl, table, ks, vs = build(gen, 2, 2, 4, 2, 16, 64, [64, 30], F32, page=page)
    one, one_lse = run_kernel(q, kc, vc, sl, table, {"BLOCK_N": 16, "SPLITS": 1})
    for splits in (3, 4):  # 4 tiles: 4 splits of one tile; sequence 2 leaves splits empty
        many, many_lse = run_kernel(q, kc, vc, sl, table, {"BLOCK_N": 16, "SPLITS": splits})
        torch.testing.assert_close(many, one, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(many_lse, one_lse, rtol=1e-5, atol=1e-6)
    check(one, oracle(q, ks, vs, 0.25)[0], F32)


def test_default_config_runs_and_lse_is_optional(gen):
    q, kc, vc, sl, table, ks, vs = build(gen, 2, 1, 4, 1, 16, 33, [33, 5], F32, page=16)
    with force_variant("attention_decode", TRITON):
        out = attention_decode(q, kc, vc, sl, table)
        out2, lse = attention_decode(q, kc, vc, sl, table, return_lse=True)
    assert isinstance(out, torch.Tensor) and out.is_contiguous()
    torch.testing.assert_close(out, out2)
    want, want_lse = oracle(q, ks, vs, 0.25)
    check(out, want, F32)
    assert lse.shape == (2, 4, 1) and lse.dtype == F32
    check(lse, want_lse, F32)


def test_strided_inputs(gen):
    """q with a head-dim stride of 2, the cache stored head-major [B, H, ctx, D] and passed
    as a [B, ctx, H, D] view, the table and seqlens non-contiguous views."""
    q, kc, vc, sl, _, ks, vs = build(gen, 2, 1, 4, 2, 16, 24, [24, 9], F32)
    q_view = torch.full((2, 1, 4, 32), float("nan"))[..., ::2].copy_(q)  # head-dim stride 2
    k_view = kc.transpose(1, 2).contiguous().transpose(1, 2)
    v_view = vc.transpose(1, 2).contiguous().transpose(1, 2)
    sl_view = torch.stack([sl, sl], 1)[:, 0]
    assert not (q_view.is_contiguous() or k_view.is_contiguous() or sl_view.is_contiguous())
    out, _ = run_kernel(q_view, k_view, v_view, sl_view, None, {"BLOCK_N": 16, "SPLITS": 2})
    check(out, oracle(q, ks, vs, 0.25)[0], F32)

    q, kc, vc, sl, table, ks, vs = build(gen, 2, 1, 4, 2, 16, 40, [40, 9], F32, page=16)
    wide = torch.full((table.shape[0], 2 * table.shape[1]), 10**6, dtype=torch.int32)
    wide[:, ::2] = table
    for block_n in (16, 32):  # one table entry a tile; a gather per token
        out, _ = run_kernel(q, kc, vc, sl, wide[:, ::2], {"BLOCK_N": block_n, "SPLITS": 1})
        check(out, oracle(q, ks, vs, 0.25)[0], F32)


def test_nan_in_a_live_key_poisons_only_its_sequence(gen):
    q, kc, vc, sl, table, ks, vs = build(gen, 2, 1, 4, 2, 16, 20, [20, 20], F32, page=4)
    kc[table[0, 2], 1, 0, 3] = float("nan")  # token 9 of sequence 0, KV head 0
    out, _ = run_kernel(q, kc, vc, sl, table, {"BLOCK_N": 16, "SPLITS": 2})
    assert bool(out[0, 0, :2].isnan().all())  # query heads 0-1 read KV head 0
    assert bool(torch.isfinite(out[0, 0, 2:]).all()) and bool(torch.isfinite(out[1]).all())


def test_large_scores_do_not_overflow(gen):
    q, kc, vc, sl, _, ks, vs = build(gen, 1, 1, 2, 1, 16, 40, [40], F32)
    q = q * 300
    out, lse = run_kernel(q, kc, vc, sl, None, {"BLOCK_N": 16, "SPLITS": 3})
    want, want_lse = oracle(q, ks, vs, 0.25)
    check(out, want, F32)
    check(lse, want_lse, F32)


def test_empty_inputs(gen):
    with force_variant("attention_decode", TRITON):
        for B, Sq in ((0, 1), (2, 0)):
            q = torch.randn(B, Sq, 4, 16)
            out, lse = attention_decode(q, torch.randn(B, 8, 2, 16), torch.randn(B, 8, 2, 16),
                                        torch.zeros(B, dtype=torch.int32), return_lse=True)
            assert out.shape == (B, Sq, 4, 16) and lse.shape == (B, 4, Sq)
        q = torch.randn(2, 1, 4, 16)
        no_blocks = (torch.randn(0, 4, 2, 16), torch.zeros(2, 3, dtype=torch.int32))
        for kc, table in ((torch.randn(2, 0, 2, 16), None), no_blocks, (torch.randn(2, 8, 2, 16), None)):
            out, lse = attention_decode(q, kc, kc.clone(), torch.zeros(2, dtype=torch.int32), table,
                                        return_lse=True)
            assert bool((out == 0).all()) and bool((lse == float("-inf")).all())


def test_head_dim_not_a_power_of_two(gen):
    q, kc, vc, sl, table, ks, vs = build(gen, 2, 1, 4, 2, 24, 30, [30, 11], F32, page=8)
    out, _ = run_kernel(q, kc, vc, sl, table, {"BLOCK_N": 16, "SPLITS": 2})
    check(out, oracle(q, ks, vs, 24 ** -0.5)[0], F32)


# ---------------------------------------------------------------------------
# Reference and vendor-free paths (bf16, fp64, D > 256)
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [BF16, F64], ids=str)
@pytest.mark.parametrize("page", [None, 4])
def test_reference_path(dtype, page, gen):
    q, kc, vc, sl, table, ks, vs = build(gen, 3, 2, 8, 2, 16, 20, [20, 1, 13], dtype, page=page)
    with force_variant("attention_decode", "reference"):
        out, lse = attention_decode(q, kc, vc, sl, table, return_lse=True)
    want, want_lse = oracle(q, ks, vs, 0.25)
    check(out, want, dtype)
    check(lse, want_lse, F64 if dtype == F64 else F32)


@pytest.mark.parametrize("page", [None, 4])
def test_sdpa_variant_logic_on_cpu(page, gen):
    """The vendor variant is CUDA-only in dispatch; its gather, mask and LSE
    are plain torch, checked here by calling it directly."""
    q, kc, vc, sl, table, ks, vs = build(gen, 3, 3, 8, 2, 16, 20, [20, 1, 13], F32, page=page)
    out, lse = A.OP.variant("torch_sdpa").run({}, q, kc, vc, sl, 0.25, True, table)
    want, want_lse = oracle(q, ks, vs, 0.25)
    check(out, want, F32)
    check(lse, want_lse, F32)
    out, lse = A.OP.variant("torch_sdpa").run({}, q, kc, vc, sl, 0.25, False, table)
    check(out, want, F32)
    assert lse.numel() == 0


def test_fp64_and_wide_heads_go_to_the_reference(gen):
    q, kc, vc, sl, _, ks, vs = build(gen, 1, 1, 2, 1, 16, 5, [5], F64)
    d = dispatch.explain("attention_decode", q, kc, vc, sl, 0.25, False, None)
    assert d.variant.name == "reference" and "float64" in d.rejected[TRITON]
    check(attention_decode(q, kc, vc, sl), oracle(q, ks, vs, 0.25)[0], F64)
    q, kc, vc, sl, _, _, _ = build(gen, 1, 1, 2, 1, 320, 5, [5], F32)
    d = dispatch.explain("attention_decode", q, kc, vc, sl, 0.1, False, None)
    assert d.variant.name == "reference" and "head dim 320 exceeds 256" in d.rejected[TRITON]


# ---------------------------------------------------------------------------
# Registry, dispatch, configs
# ---------------------------------------------------------------------------
def test_registered_with_all_variants():
    op = registry.get("attention_decode")
    assert [v.name for v in op.variants] == [TRITON, "torch_sdpa", "reference"]
    assert op.variant("torch_sdpa").kind == "vendor" and op.variant("torch_sdpa").devices == ("cuda",)
    assert op.variant("reference").devices == ("cpu", "cuda")
    samples = op.samples(torch.device("cpu"))
    dtypes = {s[0].dtype for s in samples}
    assert dtypes == {F16, BF16, F32, F64}
    assert any(s[-1] is None for s in samples) and any(s[-1] is not None for s in samples)
    assert any(not s[5] for s in samples)
    triton = op.variant(TRITON)
    configs = [(s, triton.default_config(*s)) for s in samples if s[0].dtype != F64]
    assert {c["SPLITS"] == 1 for _, c in configs} == {True, False}  # direct write and combine
    pages = {s[1].shape[1] % c["BLOCK_N"] == 0 for s, c in configs if s[-1] is not None}
    assert pages == {True, False}  # one table entry a tile, and a gather per token


def test_dispatch_picks_the_kernel_and_buckets_the_layout(gen):
    q, kc, vc, sl, table, _, _ = build(gen, 2, 1, 8, 2, 16, 32, [32, 3], F32, page=16)
    d = dispatch.explain("attention_decode", q, kc, vc, sl, 0.25, True, table)
    assert d.variant.name == TRITON and d.source == "default"
    assert "torch_sdpa" in d.rejected and "cuda" in d.rejected["torch_sdpa"]
    v = A.OP.variant(TRITON)
    assert v.bucket(q, kc, vc, sl, 0.25, True, table).endswith(":p16")
    q, kc, vc, sl, _, _, _ = build(gen, 2, 1, 8, 2, 16, 32, [32, 3], F32)
    assert v.bucket(q, kc, vc, sl, 0.25, True, None).endswith(":c")


def test_memo_key_tells_layouts_apart(gen):
    q, kc, vc, sl, table, _, _ = build(gen, 2, 1, 4, 2, 16, 16, [16, 3], F32, page=8)
    key = A.OP.memo_key(q, kc, vc, sl, 0.25, False, table)
    assert key != A.OP.memo_key(q, kc, vc, sl, 0.25, True, table)
    assert key != A.OP.memo_key(q, kc, vc, sl, 0.25, False, table[:, :1])
    assert key != A.OP.memo_key(q, kc, vc, sl, 0.5, False, table)


def test_a_short_context_is_one_launch(gen, monkeypatch):
    """At most ``SINGLE_SPLIT_TILES`` tiles a sequence: one split, and the bound runner makes one
    launch (the split kernel writes the output; no combine, no partials), matching the oracle."""
    q, kc, vc, sl, _, ks, vs = build(gen, 2, 1, 8, 2, 16, 100, [100, 37])  # fp32: 32-token tiles, 4 of them
    assert K.default_config(2, 8, 2, 1, 16, 100, 4)["SPLITS"] == 1
    launches = []
    real = A.launch.prepare

    def counted(fn, *a, **kw):
        go = real(fn, *a, **kw)
        return lambda *t: launches.append(fn) or go(*t)
    monkeypatch.setattr(A.launch, "prepare", counted)
    dispatch.reset()
    want, want_lse = oracle(q, ks, vs, 0.25)
    for _ in range(2):  # decides and binds, then the memo hit
        launches.clear()
        out, lse = attention_decode(q, kc, vc, sl, scale=0.25, return_lse=True)
        check(out, want.to(F32), F32)
        check(lse, want_lse.to(F32), F32)
    assert launches == [K.split_kv_kernel]


def test_split_heuristic_fills_the_gpu():
    # The shapes: Hq 32, H_kv 8, D 128, bf16, one query token.
    one_long = K.default_config(1, 32, 8, 1, 128, 131072, 2)
    assert one_long["SPLITS"] * 8 >= 4 * 132 and one_long["BLOCK_N"] == 64
    assert K.default_config(16, 32, 8, 1, 128, 32768, 2)["SPLITS"] * 16 * 8 >= 4 * 132
    assert K.default_config(64, 32, 8, 1, 128, 4096, 2)["SPLITS"] == 1  # 512 programs already
    assert K.default_config(1, 32, 8, 1, 128, 128, 2)["SPLITS"] == 1  # two tiles: nothing to split
    for cfg in K.configs(1, 32, 8, 1, 128, 131072, 2) + K.configs(4, 64, 8, 4, 256, 4096, 4):
        assert 1 <= cfg["SPLITS"] <= K.MAX_SPLITS
    assert all(K.smem_bytes(c["BLOCK_N"], 256, 4, c["num_stages"]) <= K.SMEM_LIMIT
               for c in K.configs(4, 64, 8, 4, 256, 4096, 4))
    # GQA group 8 x 4 tokens = 32 rows in one program; 16 x 16 = 256 rows: four.
    assert K.split_programs(1, 64, 8, 4, 128, 1) == 8
    assert K.split_programs(1, 128, 8, 16, 128, 1) == 8 * 4


# ---------------------------------------------------------------------------
# torch.library, torch.compile, autograd
# ---------------------------------------------------------------------------
def test_opcheck(gen):
    q, kc, vc, sl, table, _, _ = build(gen, 2, 2, 4, 2, 16, 16, [16, 5], F32, page=8)
    result = torch.library.opcheck(torch.ops.opforge.attention_decode.default, (q, kc, vc, sl, 0.25, True, table))
    assert set(result.values()) == {"SUCCESS"}, result


def test_compile_fullgraph(gen):
    torch._dynamo.reset()
    q, kc, vc, sl, table, ks, vs = build(gen, 2, 1, 4, 2, 16, 16, [16, 5], F32, page=8)

    def f(q, kc, vc, sl, table):
        out, lse = attention_decode(q, kc, vc, sl, table, return_lse=True)
        return out * 2, lse

    out, lse = torch.compile(f, fullgraph=True, backend="eager")(q, kc, vc, sl, table)
    want, want_lse = oracle(q, ks, vs, 0.25)
    check(out / 2, want, F32)
    check(lse, want_lse, F32)
    torch._dynamo.reset()


def test_not_differentiable(gen):
    q, kc, vc, sl, _, _, _ = build(gen, 1, 1, 2, 1, 16, 4, [4], F32)
    out = attention_decode(q.requires_grad_(), kc, vc, sl)
    with pytest.raises(RuntimeError, match="opforge.attention_decode is inference only"):
        out.sum().backward()
    with torch.no_grad():
        assert not attention_decode(q, kc, vc, sl).requires_grad


# ---------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------
def test_clear_errors():
    q = torch.randn(2, 1, 4, 16)
    kc = torch.randn(2, 8, 2, 16)
    sl = torch.tensor([8, 3], dtype=torch.int32)
    fn = attention_decode
    with pytest.raises(TypeError, match="opforge.attention_decode: q must be a torch.Tensor, got list"):
        fn([1.0], kc, kc, sl)
    with pytest.raises(ValueError, match=r"opforge.attention_decode: q must have 4 dims .* got shape \(1, 4, 16\)"):
        fn(torch.randn(1, 4, 16), kc, kc, sl)
    with pytest.raises(TypeError, match="must have one dtype"):
        fn(q.half(), kc, kc, sl)
    with pytest.raises(ValueError, match=r"head dim of k_cache \(32\) does not match q's \(16\)"):
        fn(q, torch.randn(2, 8, 2, 32), torch.randn(2, 8, 2, 32), sl)
    with pytest.raises(ValueError, match=r"v_cache has shape \(2, 4, 2, 16\) but k_cache has \(2, 8, 2, 16\)"):
        fn(q, kc, torch.randn(2, 4, 2, 16), sl)
    with pytest.raises(ValueError, match="q has 4 heads, not a multiple of the 3 KV heads"):
        fn(q, torch.randn(2, 8, 3, 16), torch.randn(2, 8, 3, 16), sl)
    with pytest.raises(TypeError, match="seqlens must be int32, got torch.int64"):
        fn(q, kc, kc, sl.long())
    with pytest.raises(ValueError, match=r"seqlens must have shape \(2,\)"):
        fn(q, kc, kc, sl[:1])
    with pytest.raises(ValueError, match="k_cache has batch 3 but q has 2"):
        fn(q, torch.randn(3, 8, 2, 16), torch.randn(3, 8, 2, 16), sl)
    with pytest.raises(TypeError, match="block_table must be int32, got torch.int64"):
        fn(q, kc, kc, sl, torch.zeros(2, 2, dtype=torch.int64))
    with pytest.raises(ValueError, match=r"block_table must have shape \(2, max_blocks\), got \(3, 2\)"):
        fn(q, kc, kc, sl, torch.zeros(3, 2, dtype=torch.int32))
    with pytest.raises(ValueError, match=r"block_table must have shape \(2, max_blocks\), got \(2,\)"):
        fn(q, kc, kc, sl, torch.zeros(2, dtype=torch.int32))
    with pytest.raises(TypeError, match="scale must be a float, got str"):
        fn(q, kc, kc, sl, scale="x")
    with pytest.raises(ValueError, match="scale must be finite"):
        fn(q, kc, kc, sl, scale=float("inf"))
    with pytest.raises(TypeError, match="opforge.attention_decode: complex"):
        fn(q, kc.to(torch.complex64), kc, sl)


@pytest.mark.parametrize("variant", [TRITON, "reference"])
def test_value_errors_on_cpu(variant):
    q = torch.randn(2, 1, 4, 16)
    kc = torch.randn(5, 4, 2, 16)  # 5 blocks of 4 tokens
    table = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32)
    with force_variant("attention_decode", variant):
        with pytest.raises(ValueError, match=r"seqlens\[1\] = 9 exceeds the cache capacity 8 "
                                             r"\(2 blocks of block_table x block_size 4\)"):
            attention_decode(q, kc, kc, torch.tensor([8, 9], dtype=torch.int32), table)
        with pytest.raises(ValueError, match=r"seqlens\[0\] = -1 is negative"):
            attention_decode(q, kc, kc, torch.tensor([-1, 2], dtype=torch.int32), table)
        with pytest.raises(ValueError, match=r"block_table\[1, 1\] = 5 is not a block of k_cache"):
            attention_decode(q, kc, kc, torch.tensor([3, 5], dtype=torch.int32),
                             torch.tensor([[0, 1], [2, 5]], dtype=torch.int32))
        # a dead entry (past the last live block) may hold anything
        out = attention_decode(q, kc, kc, torch.tensor([3, 4], dtype=torch.int32),
                               torch.tensor([[0, -1], [2, 99]], dtype=torch.int32))
        assert bool(torch.isfinite(out).all())
        with pytest.raises(ValueError, match=r"seqlens\[0\] = 9 exceeds the cache capacity 8 \(max_ctx"):
            attention_decode(q, torch.randn(2, 8, 2, 16), torch.randn(2, 8, 2, 16),
                             torch.tensor([9, 1], dtype=torch.int32))
