"""Fused Triton sampling kernel: same contract and same draws as `torch_ops.sample`.

One program handles ROWS rows (1 on a GPU; many under TRITON_INTERPRET=1, where per-op overhead
dominates) and streams each row in BLOCK-sized tiles:

* pass 1 (fused logit processing): logits + logit_bias, penalties from the output counts,
  grammar bitmask -> processed logits (written to a workspace only when something was applied),
  while tracking the argmax and an online logsumexp (for greedy rows and the chosen logprob).
* top-k / top-p without a sort: a binary search over the 32-bit order-preserving integer key of the
  scaled logit (32 passes: exact, tie-inclusive). top-k finds the largest key with at least k tokens
  at or above it; top-p the smallest key whose mass strictly above is < top_p of the top-k mass.
  min-p is a direct threshold: x >= max + log(min_p). A program whose rows need none of these
  skips the passes (on a GPU a program is one row); a row that fits one tile (SINGLE_TILE) stays in
  registers across passes instead of being re-read.
* the draw: one survivor-mass pass, then an inverse-CDF pass in vocabulary order with a uniform from
  the counter-based hash of (seed, step) — the very hash `torch_ops.counter_uniform` computes.

The min-new-tokens ban (a handful of ids) is applied by an index_fill on a copy of the logits before
the kernel; as it sets -inf, which every later step keeps, this equals applying it last.
Top-N logprobs use torch.topk on the log_softmax of the processed logits, outside the kernel.
Importing this module needs no GPU; without Triton `triton_sample` raises.
"""

from __future__ import annotations

import torch

from radixgen.sampling.torch_ops import NEG_INF, SampleOutput, SamplingBatch, finish_output

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - triton is a dependency, but keep import-time safe
    triton = None
    tl = None

HAVE_TRITON = triton is not None

if HAVE_TRITON:

    @triton.jit
    def _mix32(x):
        """torch_ops._mix32 on int64 values in [0, 2^32)."""
        x = (((x >> 16) ^ x) * 0x45D9F3B) & 0xFFFFFFFF
        x = (((x >> 16) ^ x) * 0x45D9F3B) & 0xFFFFFFFF
        return (x >> 16) ^ x

    @triton.jit
    def _counter_uniform(seed, step):
        """torch_ops.counter_uniform: int64 [R] seeds and steps -> float32 [R] in (0, 1)."""
        h = _mix32((seed & 0xFFFFFFFF) ^ 0x9E3779B9)
        h = _mix32(h ^ ((seed >> 32) & 0xFFFFFFFF) ^ 0x85EBCA6B)
        h = _mix32(h ^ (((step & 0xFFFFFFFF) * 0x2545F491 + 0xC2B2AE35) & 0xFFFFFFFF))
        h = _mix32(h ^ 0x27D4EB2F)
        return ((h >> 9).to(tl.float32) + 0.5) * (1.0 / 8388608.0)

    @triton.jit
    def _order_key(x):
        """float32 -> int64 key with the same order (-0.0 and +0.0 share a key)."""
        x = tl.where(x == 0.0, 0.0, x)
        b = x.to(tl.int32, bitcast=True)
        return tl.where(b < 0, b ^ 0x7FFFFFFF, b).to(tl.int64)

    @triton.jit
    def _scaled_tile(proc_ptr, row_off, row_ok, inv_t, start, cols, V):
        """One tile of scaled logits x [R, BLOCK] (-inf outside the row) and its in-row mask."""
        offs = start + cols
        ok = row_ok[:, None] & (offs < V)[None, :]
        x = tl.load(proc_ptr + row_off[:, None] + offs[None, :], mask=ok, other=float("-inf"))
        return x * inv_t[:, None], ok

    @triton.jit
    def _survivor_weights(x, ok, key, m_s, t_key, x_floor, USE_KEY: tl.constexpr, USE_FLOOR: tl.constexpr):
        """exp(x - max) [R, BLOCK] for tokens passing top-k/top-p (key >= t_key) and min-p (x >= x_floor)."""
        keep = ok
        if USE_KEY:
            keep = keep & (key >= t_key[:, None])
        if USE_FLOOR:
            keep = keep & (x >= x_floor[:, None])
        return tl.where(keep, tl.exp(x - m_s[:, None]), 0.0)

    @triton.jit
    def _fused_sample_kernel(
        logits_ptr, proc_ptr, bitmask_ptr, bias_ptr, counts_ptr,
        temp_ptr, inv_t_ptr, top_k_ptr, top_p_ptr, log_min_p_ptr,
        rep_ptr, freq_ptr, pres_ptr, seed_ptr, step_ptr,
        token_ptr, logprob_ptr,
        B, V, stride, mask_stride,
        ROWS: tl.constexpr, BLOCK: tl.constexpr, SINGLE_TILE: tl.constexpr,
        HAS_MASK: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_PENALTIES: tl.constexpr,
        WRITE_PROC: tl.constexpr, ALL_GREEDY: tl.constexpr,
        NEED_TOP_K: tl.constexpr, NEED_TOP_P: tl.constexpr, NEED_MIN_P: tl.constexpr,
    ):
        """One program = ROWS rows; SINGLE_TILE (V <= BLOCK) keeps the row in registers between passes."""
        rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)  # [R]
        row_ok = rows < B
        rows64 = rows.to(tl.int64)
        row_off = rows64 * stride  # [R]
        dense_off = rows64 * V  # [R], rows of bias / counts
        cols = tl.arange(0, BLOCK)  # [BLOCK]
        USE_KEY: tl.constexpr = NEED_TOP_K or NEED_TOP_P

        # ---- pass 1: process logits, argmax, online logsumexp --------------------------------
        if HAS_PENALTIES:
            rep = tl.load(rep_ptr + rows, mask=row_ok, other=1.0)[:, None]  # [R, 1]
            freq = tl.load(freq_ptr + rows, mask=row_ok, other=0.0)[:, None]
            pres = tl.load(pres_ptr + rows, mask=row_ok, other=0.0)[:, None]
        m0 = tl.full([ROWS], float("-inf"), tl.float32)  # running max of processed logits
        z0 = tl.zeros([ROWS], tl.float32)  # sum exp(logit - m0)
        arg = tl.zeros([ROWS], tl.int64)
        l_tile = tl.zeros([ROWS, BLOCK], tl.float32)  # the whole row when SINGLE_TILE
        for start in range(0, V, BLOCK):
            offs = start + cols  # [BLOCK]
            ok = row_ok[:, None] & (offs < V)[None, :]  # [R, BLOCK]
            lg = tl.load(logits_ptr + row_off[:, None] + offs[None, :], mask=ok, other=float("-inf"))
            lg = lg.to(tl.float32)
            if HAS_BIAS:
                lg += tl.load(bias_ptr + dense_off[:, None] + offs[None, :], mask=ok, other=0.0)
            if HAS_PENALTIES:
                cnt = tl.load(counts_ptr + dense_off[:, None] + offs[None, :], mask=ok, other=0)
                seen = cnt > 0
                lg = tl.where(seen, tl.where(lg > 0, lg / rep, lg * rep), lg)
                lg = lg - freq * cnt.to(tl.float32) - pres * seen.to(tl.float32)
            if HAS_MASK:
                word = tl.load(bitmask_ptr + rows64[:, None] * mask_stride + (offs >> 5)[None, :],
                               mask=ok, other=0)  # [R, BLOCK] int32
                lg = tl.where(((word >> (offs & 31)[None, :]) & 1) != 0, lg, float("-inf"))
            if WRITE_PROC:
                tl.store(proc_ptr + row_off[:, None] + offs[None, :], lg, mask=ok)
            if SINGLE_TILE:
                l_tile = lg
            b_max = tl.max(lg, 1)  # [R]
            b_arg = tl.argmax(lg, 1, tie_break_left=True).to(tl.int64) + start
            arg = tl.where(b_max > m0, b_arg, arg)
            m_new = tl.maximum(m0, b_max)
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            z0 = z0 * tl.exp(m0 - m_safe) + tl.sum(tl.exp(lg - m_safe[:, None]), 1)
            m0 = m_new
        if WRITE_PROC:
            tl.debug_barrier()

        token = arg
        if not ALL_GREEDY:
            temp = tl.load(temp_ptr + rows, mask=row_ok, other=0.0)
            inv_t = tl.load(inv_t_ptr + rows, mask=row_ok, other=1.0)  # [R]
            m_s = tl.where(m0 == float("-inf"), 0.0, m0 * inv_t)  # [R], max of the scaled logits
            t_key = tl.full([ROWS], -2147483648, tl.int64)  # keep every key
            if SINGLE_TILE:
                x_t = l_tile * inv_t[:, None]  # [R, BLOCK]
                ok_t = row_ok[:, None] & (cols < V)[None, :]
                key_t = _order_key(x_t)

            # ---- top-k: largest key t with count(key >= t) >= k --------------------------------
            if NEED_TOP_K:
                k = tl.load(top_k_ptr + rows, mask=row_ok, other=V)
                lo = tl.full([ROWS], -2147483648, tl.int64)  # count(key >= lo) = V >= k
                hi = tl.full([ROWS], 2147483648, tl.int64)  # count(key >= hi) = 0 < k
                n_iter = 32 * tl.max((k < V).to(tl.int32), 0)  # 0 when no row here cuts
                for _ in range(0, n_iter):
                    mid = (lo + hi) >> 1
                    count = tl.zeros([ROWS], tl.int64)
                    for start in range(0, V, BLOCK):
                        if SINGLE_TILE:
                            ok, key = ok_t, key_t
                        else:
                            x, ok = _scaled_tile(proc_ptr, row_off, row_ok, inv_t, start, cols, V)
                            key = _order_key(x)
                        count += tl.sum((ok & (key >= mid[:, None])).to(tl.int64), 1)
                    ge = count >= k
                    lo = tl.where(ge, mid, lo)
                    hi = tl.where(ge, hi, mid)
                t_key = tl.where(k < V, lo, t_key)

            # ---- top-p: smallest key t with mass(key > t) < top_p * mass(top-k) ----------------
            if NEED_TOP_P:
                p = tl.load(top_p_ptr + rows, mask=row_ok, other=1.0)
                lo = tl.full([ROWS], -2147483649, tl.int64)  # predicate false
                hi = tl.full([ROWS], 2147483647, tl.int64)  # predicate true
                n_iter = 32 * tl.max((p < 1.0).to(tl.int32), 0)
                if SINGLE_TILE:
                    e_t = tl.where(ok_t & (key_t >= t_key[:, None]), tl.exp(x_t - m_s[:, None]), 0.0)
                    total_t = tl.sum(e_t, 1)
                for _ in range(0, n_iter):
                    mid = (lo + hi) >> 1
                    if SINGLE_TILE:
                        total = total_t
                        above = tl.sum(tl.where(key_t > mid[:, None], e_t, 0.0), 1)
                    else:
                        above = tl.zeros([ROWS], tl.float32)
                        total = tl.zeros([ROWS], tl.float32)
                        for start in range(0, V, BLOCK):
                            x, ok = _scaled_tile(proc_ptr, row_off, row_ok, inv_t, start, cols, V)
                            key = _order_key(x)
                            e = tl.where(ok & (key >= t_key[:, None]), tl.exp(x - m_s[:, None]), 0.0)
                            total += tl.sum(e, 1)
                            above += tl.sum(tl.where(key > mid[:, None], e, 0.0), 1)
                    inside = above < p * total
                    hi = tl.where(inside, mid, hi)
                    lo = tl.where(inside, lo, mid)
                t_key = tl.where(p < 1.0, tl.maximum(t_key, hi), t_key)

            # ---- min-p: x >= max + log(min_p) ---------------------------------------------------
            x_floor = m_s
            if NEED_MIN_P:
                x_floor = m_s + tl.load(log_min_p_ptr + rows, mask=row_ok, other=float("-inf"))

            # ---- inverse-CDF draw over the survivors, vocabulary order -------------------------
            seed = tl.load(seed_ptr + rows, mask=row_ok, other=0)
            step = tl.load(step_ptr + rows, mask=row_ok, other=0)
            u = _counter_uniform(seed, step)  # [R]
            n_blocks = tl.cdiv(V, BLOCK) * tl.max((temp > 0.0).to(tl.int32), 0)  # 0: all greedy
            carry = tl.zeros([ROWS], tl.float32)
            first = tl.full([ROWS], 2147483647, tl.int64)
            last = tl.full([ROWS], -1, tl.int64)
            if SINGLE_TILE:
                e_t = _survivor_weights(x_t, ok_t, key_t, m_s, t_key, x_floor, USE_KEY, NEED_MIN_P)
                target = u * tl.sum(e_t, 1)
            else:
                total = tl.zeros([ROWS], tl.float32)
                for b in range(0, n_blocks):
                    x, ok = _scaled_tile(proc_ptr, row_off, row_ok, inv_t, b * BLOCK, cols, V)
                    key = _order_key(x) if USE_KEY else x
                    total += tl.sum(_survivor_weights(x, ok, key, m_s, t_key, x_floor, USE_KEY, NEED_MIN_P), 1)
                target = u * total  # [R]
            for b in range(0, n_blocks):
                if SINGLE_TILE:
                    e = e_t
                else:
                    x, ok = _scaled_tile(proc_ptr, row_off, row_ok, inv_t, b * BLOCK, cols, V)
                    key = _order_key(x) if USE_KEY else x
                    e = _survivor_weights(x, ok, key, m_s, t_key, x_floor, USE_KEY, NEED_MIN_P)
                cdf = carry[:, None] + tl.cumsum(e, 1)  # [R, BLOCK]
                offs64 = (b * BLOCK + cols).to(tl.int64)[None, :]
                hit = (cdf > target[:, None]) & (e > 0.0)
                first = tl.minimum(first, tl.min(tl.where(hit, offs64, 2147483647), 1))
                last = tl.maximum(last, tl.max(tl.where(e > 0.0, offs64, -1), 1))
                carry += tl.sum(e, 1)
            sampled = tl.where(first < 2147483647, first, last)
            token = tl.where(temp == 0.0, arg, sampled)

        chosen = tl.load(proc_ptr + row_off + token, mask=row_ok, other=0.0)  # [R]
        tl.store(token_ptr + rows, token, mask=row_ok)
        tl.store(logprob_ptr + rows, chosen - m0 - tl.log(tl.where(row_ok, z0, 1.0)), mask=row_ok)


def _launch_config(batch_size: int, vocab_size: int, device: torch.device) -> tuple[int, int, int]:
    """(ROWS, BLOCK, num_warps). GPU: a row per program. Interpreter: many rows per program so
    each numpy op works on ~64K elements. BLOCK depends only on V, so a row's arithmetic (and its
    draw) is the same whatever batch it is in."""
    if device.type == "cuda":
        block = min(4096, triton.next_power_of_2(vocab_size))
        return 1, block, 8 if block >= 2048 else 4
    block = min(8192, triton.next_power_of_2(vocab_size))
    rows = min(triton.next_power_of_2(batch_size), max(1, 65536 // block))
    return rows, block, 4


def triton_sample(logits: torch.Tensor, batch: SamplingBatch, bitmask: torch.Tensor | None = None) -> SampleOutput:
    """Fused-kernel twin of `torch_ops.sample` (same arguments, same outputs)."""
    if not HAVE_TRITON:
        raise RuntimeError("triton is not installed; use the torch sampling backend")
    B, V = logits.shape
    logits = logits.to(torch.float32).contiguous()  # [B, V]
    if batch.min_tokens_ban is not None:
        logits = logits.clone()
        logits.view(-1).index_fill_(0, batch.min_tokens_ban, NEG_INF)
    has_mask, has_bias = bitmask is not None, batch.logit_bias is not None
    preprocess = has_mask or has_bias or batch.need_penalties
    if batch.all_greedy and not preprocess and not batch.need_logprobs:
        return SampleOutput(next_token_ids=logits.argmax(-1))  # greedy fast path: one argmax
    if has_mask and (bitmask.shape[0] != B or bitmask.shape[1] * 32 < V):
        raise ValueError(f"bitmask must be int32 [{B}, >= {(V + 31) // 32}], got {tuple(bitmask.shape)}")
    proc = torch.empty_like(logits) if preprocess else logits  # [B, V] processed logits
    tokens = torch.empty(B, dtype=torch.int64, device=logits.device)
    chosen_logprobs = torch.empty(B, dtype=torch.float32, device=logits.device)
    bitmask = bitmask.to(torch.int32).contiguous() if has_mask else logits
    pen = batch.need_penalties
    rows, block, num_warps = _launch_config(B, V, logits.device)
    _fused_sample_kernel[(triton.cdiv(B, rows),)](
        logits, proc, bitmask, batch.logit_bias if has_bias else logits,
        batch.output_counts if pen else logits,
        batch.temperatures, batch.inv_temperatures, batch.top_ks, batch.top_ps, batch.log_min_ps,
        batch.repetition_penalties if pen else logits, batch.frequency_penalties if pen else logits,
        batch.presence_penalties if pen else logits, batch.seeds, batch.steps,
        tokens, chosen_logprobs,
        B, V, logits.stride(0), bitmask.stride(0) if has_mask else 0,
        ROWS=rows, BLOCK=block, SINGLE_TILE=V <= block,
        HAS_MASK=has_mask, HAS_BIAS=has_bias, HAS_PENALTIES=pen, WRITE_PROC=preprocess,
        ALL_GREEDY=batch.all_greedy, NEED_TOP_K=batch.need_top_k, NEED_TOP_P=batch.need_top_p,
        NEED_MIN_P=batch.need_min_p, num_warps=num_warps,
    )
    return finish_output(tokens, proc, batch, chosen_logprobs=chosen_logprobs)
