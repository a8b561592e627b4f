"""`wide_matmul_dtype`: long prompt chunks of the float32 GGUF model through bfloat16 GEMMs (AMX tiles
reading the blocks, else oneDNN on slices of its matrices), or through the block kernel with their
activations in two int8 limbs (int16) or one (int8), every other row through the float32 block kernel.

Oracles: HF transformers on the same GGUF (float32 logits within the tolerance EngineConfig states,
and no further on average than HF's own bfloat16 model), and the same requests run alone (a short
request's logits in a step beside a long chunk are float32's)."""

from __future__ import annotations

import copy

import pytest
import torch

from radixgen.runtime.config import EngineConfig
from radixgen.runtime.executor.forward_batch import make_forward_batch
from radixgen.runtime.executor.model_runner import ModelRunner, wide_matmul
from radixgen.runtime.kernels import extend_attention as c_extend
from radixgen.runtime.kernels import ffi
from radixgen.runtime.kernels.block_gemm import bf16_tiles_available
from radixgen.runtime.kernels.build import cpu_flags
from radixgen.runtime.layers.attention.torch_backend import ExtendCall, SdpaCall
from radixgen.runtime.layers.linear import WideMatmul, long_extend_runs, runs_among
from tests.runtime.test_model_logits import ATOL, PROMPT, Seq

LONG_TEXT = (
    "Rivers shape the land they cross. Over thousands of years a river cuts a valley, carries sand and "
    "gravel downstream, and builds a delta where it meets the sea. Farmers settled along rivers because "
    "floods left fertile soil behind, and cities grew where a river could be crossed or where boats could "
    "unload their goods. Today engineers build dams to store water for dry seasons and to turn turbines "
    "that make electricity, while ecologists study how fish find their way upstream to spawn. A river also "
    "changes with the seasons: in spring, melting snow swells it, and in late summer it can shrink to a "
    "narrow stream between wide banks of dry stones. Writers and painters have long used rivers as symbols "
    "of time, of journeys, and of borders between one life and the next."
)
# max |logit - HF float32 logit| over LONG_TEXT's tokens, the chunk's attention in bfloat16 too where the
# CPU has it (measured: bfloat16 0.53-0.76, int16 0.26; HF's own bfloat16 model: 1.03-1.41)
WIDE_LOGIT_TOLERANCE = 1.0

pytestmark = pytest.mark.skipif(ffi.library() is None, reason="no C compiler to build the block kernels")


def _runner(path, wide: str) -> ModelRunner:
    return ModelRunner(EngineConfig(model=str(path), max_total_tokens=2048, max_running_requests=4,
                                    wide_matmul_dtype=wide))


def _extend_together(runner: ModelRunner, prompts: list[list[int]],
                     logits_rows: list[list[int]] | None = None) -> torch.Tensor:
    """New requests prefilled in one step, then ended; logits of each one's `logits_rows` (default: its last
    token), [rows, V]."""
    pool, kv = runner.req_to_token_pool, runner.token_to_kv_pool
    slots, locs = [pool.alloc() for _ in prompts], [kv.alloc(len(p)) for p in prompts]
    for slot, loc in zip(slots, locs, strict=True):
        pool.write(slot, 0, loc)
    fb = make_forward_batch(prompts, [0] * len(prompts), slots, torch.cat(locs), logits_rows,
                            table_update=pool.take_updates())
    logits = runner.forward(fb)
    for slot, loc in zip(slots, locs, strict=True):  # the requests end with the step
        kv.free(loc)
        pool.free(slot)
    return logits


@pytest.mark.parametrize("wide", ["bfloat16", "int16"])
def test_long_extends_run_below_float32_within_tolerance(smollm2_path, hf_smollm2, wide):
    from radixgen.runtime.tokenizer import load_tokenizer

    runner = _runner(smollm2_path, wide)
    ids = load_tokenizer().encode(LONG_TEXT)
    assert len(ids) > runner.model.long_extend_min
    with torch.no_grad():
        ref = hf_smollm2(torch.tensor([ids])).logits[0].float()  # [T, V]
        hf_bf16 = copy.deepcopy(hf_smollm2).to(torch.bfloat16)(torch.tensor([ids])).logits[0].float()
    diff = (Seq(runner).extend(ids, all_logits=True) - ref).abs()
    assert diff.max().item() > ATOL  # the chunk took the lower-precision path, not the float32 one
    assert diff.max().item() <= WIDE_LOGIT_TOLERANCE
    assert diff.mean().item() <= (hf_bf16 - ref).abs().mean().item()
    exact = (Seq(_runner(smollm2_path, "float32")).extend(ids, all_logits=True) - ref).abs().max().item()
    assert exact <= ATOL


def test_fewer_limbs_trade_precision_for_speed_in_order(smollm2_path, hf_smollm2):
    """On the same long chunk, HF float32 logits are matched best by int16 (two activation limbs), then
    bfloat16 GEMMs, then int8 (one limb, llama.cpp's Q8 activations), on average over its tokens."""
    from radixgen.runtime.tokenizer import load_tokenizer

    ids = load_tokenizer().encode(LONG_TEXT)
    with torch.no_grad():
        ref = hf_smollm2(torch.tensor([ids])).logits[0].float()
    mean = {w: (Seq(_runner(smollm2_path, w)).extend(ids, all_logits=True) - ref).abs().mean().item()
            for w in ("int16", "bfloat16", "int8")}
    assert mean["int16"] < mean["bfloat16"] < mean["int8"], mean


def test_auto_takes_bf16_tiles_else_int16_where_the_cpu_has_int8_dot_products():
    flags = cpu_flags()
    auto = wide_matmul("auto")
    if bf16_tiles_available():
        assert auto == WideMatmul(torch.bfloat16) and auto.in_c and wide_matmul("auto", attention_in_c=False) == auto
    elif {"avx512_vnni", "avx_vnni", "asimddp"} & flags:
        assert auto == WideMatmul(torch.float32, 2) and auto.in_c
    else:
        assert auto.limbs is None
    assert wide_matmul("auto", attention_in_c=False).limbs is None  # torch attention: its threads and ours contend
    assert wide_matmul("bfloat16").in_c == bf16_tiles_available()
    assert wide_matmul("int8") == WideMatmul(torch.float32, 1) and wide_matmul("int8").lower
    assert not wide_matmul("float32").lower


def test_short_rows_beside_a_long_chunk_stay_float32(smollm2_path):
    """A short prompt prefilled in the same step as a long one gets the logits it gets alone, within
    the float32 batching tolerance (seen: 4e-5, from attention; bfloat16 rows would move them ~1e-1),
    and the long one its own too."""
    from radixgen.runtime.tokenizer import load_tokenizer

    tok = load_tokenizer()
    long_ids, short_ids = tok.encode(LONG_TEXT), tok.encode(PROMPT)
    runner = _runner(smollm2_path, "bfloat16")
    together = _extend_together(runner, [short_ids, long_ids])
    runner = _runner(smollm2_path, "bfloat16")
    alone = torch.cat([_extend_together(runner, [short_ids]), _extend_together(runner, [long_ids])])
    torch.testing.assert_close(together, alone, rtol=0, atol=2e-4)


def test_long_extends_attend_in_bfloat16_where_the_cpu_has_it(smollm2_path):
    """The requests whose GEMMs take bfloat16 (longer than long_extend_min) go to the bfloat16 C prompt
    attention, the others to float32 SDPA; with float32 GEMMs every request stays float32."""
    runner = _runner(smollm2_path, "bfloat16")
    long = runner.model.long_extend_min
    if long is None or not c_extend.available(runner.kv_dtype):
        assert runner.attention.bf16_extend_min is None
        return
    assert runner.attention.bf16_extend_min == long
    prompts = [[1] * 10, [2] * (long + 1), [3] * long]
    fb = make_forward_batch(prompts, [0, 0, 0], [0, 1, 2], torch.arange(1, 1 + sum(map(len, prompts))))
    calls = runner.attention.init_metadata(fb, runner.req_to_token_pool.req_to_token).calls
    assert [type(c) for c in calls] == [SdpaCall, ExtendCall]
    assert calls[1].extend_lens.tolist() == [long + 1]
    assert calls[1].rows.tolist() == list(range(10, 11 + long))
    f32 = _runner(smollm2_path, "float32")
    assert f32.attention.bf16_extend_min is None
    f32_calls = f32.attention.init_metadata(fb, f32.req_to_token_pool.req_to_token).calls
    assert all(isinstance(c, SdpaCall) for c in f32_calls)


def test_sliding_window_long_chunks_attend_in_c_within_tolerance(tmp_path):
    """A Gemma 3 GGUF's long prompt chunks past its 16-token window, the second continuing a cached
    prefix: their windowed layers attend in the bfloat16 C kernel with the window, and the logits stay
    within the int16 path's error of HF's float32 ones (seen: max 0.03 on logits of std 0.54; the
    same chunks attended without the window: 3.2)."""
    from tests.runtime.gguf_models import GEMMA_WINDOW, VOCAB, write_tiny_gemma3_gguf
    from tests.runtime.test_gemma3 import Q4_K_M_MIX
    from tests.runtime.test_model_logits import hf_model

    path = write_tiny_gemma3_gguf(tmp_path / "gemma3.gguf", Q4_K_M_MIX, "Q5_0")
    runner = _runner(path, "int16")
    long = runner.model.long_extend_min
    if not c_extend.available(runner.kv_dtype, 2, 1, 256):  # no AVX512-BF16: no C path
        assert not runner.long_attention_in_c
        return
    assert runner.long_attention_in_c and runner.model.wide_in_c
    ids = torch.randint(3, VOCAB, (80 + 2 * long,), generator=torch.Generator().manual_seed(0)).tolist()
    with torch.no_grad():
        ref = hf_model(path)(torch.tensor([ids])).logits[0].float()  # [T, V]
    seq = Seq(runner)
    ours = torch.cat([seq.extend(ids[:80], all_logits=True), seq.extend(ids[80:], all_logits=True)])
    assert (ours - ref).abs().max().item() < 0.15
    fb = make_forward_batch([ids[80:]], [80], [0], torch.arange(1, 1 + len(ids) - 80))
    windowed = runner.attention.init_metadata(fb, runner.req_to_token_pool.req_to_token, window=GEMMA_WINDOW)
    assert [(type(c), c.window) for c in windowed.calls] == [(ExtendCall, GEMMA_WINDOW)]


@pytest.mark.parametrize("wide", ["int16", "int8"])
def test_last_layer_on_logits_rows_only_keeps_each_rows_precision(smollm2_path, wide):
    """A step whose last layer computes only its logits rows gives those rows the logits, bit for bit, that
    the same step gives them when every row's logits are wanted: each kept row takes the same path (a long
    chunk's rows the wide GEMM, a short request's the float32 block kernel) as among all rows. On AMX the
    head's float32 rows run on bfloat16 tiles from 16 rows on (the whole step, not the kept rows): there the
    logits agree to float32's rounding (~1e-5), far inside what another precision path moves them (>0.1)."""
    from radixgen.runtime.tokenizer import load_tokenizer

    tok = load_tokenizer()
    short_ids, long_ids = tok.encode(PROMPT), tok.encode(LONG_TEXT)
    runner = _runner(smollm2_path, wide)
    prompts = [short_ids, long_ids, short_ids[:5]]
    every = [list(range(len(p))) for p in prompts]
    some = [[len(short_ids) - 1], [0, 7, 8, 9, len(long_ids) - 1], [2, 4]]
    all_logits = _extend_together(runner, prompts, every)  # [T, V]
    starts = [0, len(short_ids), len(short_ids) + len(long_ids)]
    picked = [start + r for start, rows in zip(starts, some, strict=True) for r in rows]
    amx = ffi.library().block_gemm_amx_rows() > 0
    same = (lambda a, b: torch.allclose(a, b, rtol=0, atol=1e-4)) if amx else torch.equal
    assert same(_extend_together(runner, prompts, some), all_logits[picked])
    assert same(_extend_together(runner, [long_ids]), all_logits[starts[2] - 1 : starts[2]])


def test_runs_among_selected_rows_against_a_row_by_row_count():
    g = torch.Generator().manual_seed(0)
    for _ in range(200):
        lens = torch.randint(1, 40, (6,), generator=g).tolist()
        runs = long_extend_runs(lens, 12)
        picked = int(torch.randint(1, sum(lens), (1,), generator=g))
        rows = torch.randperm(sum(lens), generator=g)[:picked].sort().values
        in_run = [any(s <= r < e for s, e in runs) for r in rows.tolist()]
        expected, start = [], None  # the maximal stretches of selected rows that lie in runs
        for i, inside in enumerate([*in_run, False]):
            if inside and start is None:
                start = i
            if not inside and start is not None:
                expected.append((start, i))
                start = None
        assert runs_among(runs, rows) == tuple(expected)
    assert runs_among((), torch.tensor([0, 1])) == ()


def test_long_extend_runs_merge_adjacent_requests():
    # requests of 3, 100, 200, 1 and 80 new tokens, long from 64: rows 3..303 and 304..384
    assert long_extend_runs([3, 100, 200, 1, 80], 64) == ((3, 303), (304, 384))
    assert long_extend_runs([64, 1, 1], 64) == ()


def test_wide_matmul_dtype_is_checked():
    with pytest.raises(ValueError, match="wide_matmul_dtype"):
        EngineConfig(wide_matmul_dtype="float16")
