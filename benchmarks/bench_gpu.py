"""GPU benchmark on a random-weight Llama (no download): engine throughput, memory bandwidth, radix
cache, and the Triton extend kernel against torch's flash SDPA.

Builds a Llama of the given shape (default: a 1B config, hidden 2048, 16 layers, 32 heads, 8 KV
heads, vocab 128256, tied embeddings) with random bf16 weights and a word-level tokenizer in a temp
directory, then measures through `Engine` on the GPU:
  * prefill tokens/s (distinct prompts, no cache hits);
  * decode tokens/s at batch 1, 32 and 256 (128 new tokens each, ignore_eos);
  * batch-1 decode's achieved memory bandwidth (weights + KV read per step / step time) as a
    fraction of the device's peak;
  * the shared-prefix case: N requests sharing a long prefix, radix cache on vs off;
and at kernel level the Triton extend attention vs F.scaled_dot_product_attention (causal, flash)
on equal dense shapes, plus the Triton kernels' max difference from the torch path on this device.
Prints one JSON line per measurement and a summary with the ratios.

Usage: python benchmarks/bench_gpu.py [--layers 16 --hidden 2048 ...] [--tiny --device cpu]
(`--tiny --device cpu` is a smoke run of the script itself with the torch attention path; with
TRITON_INTERPRET=1 it also runs the kernel accuracy check, interpreted.)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import tempfile
import time
from pathlib import Path


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--intermediate", type=int, default=8192)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=128256)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--kv-tokens", type=int, default=400_000, help="KV pool capacity in tokens")
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--prefill-n", type=int, default=8)
    ap.add_argument("--prefill-len", type=int, default=2048)
    ap.add_argument("--shared-n", type=int, default=64)
    ap.add_argument("--shared-prefix", type=int, default=4096)
    ap.add_argument("--peak-gb-s", type=float, default=None, help="device peak bandwidth (default: by name)")
    ap.add_argument("--tiny", action="store_true", help="small shapes: a smoke run of this script")
    return ap


if __name__ == "__main__":
    build_parser().parse_args()  # --help and bad flags answer before torch is imported

import torch  # noqa: E402

PEAK_GBS = {"H200": 4800.0, "H100": 3350.0, "A100": 2039.0, "L40S": 864.0}  # HBM/GDDR peak, GB/s


def emit(record: dict) -> None:
    print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in record.items()}), flush=True)


def build_random_llama(out: Path, args: argparse.Namespace) -> int:
    """Write config.json, random bf16 safetensors and a word-level tokenizer; return the byte size of
    the weights one decode step reads (all matrices once; the embedding is the tied lm_head)."""
    from safetensors.torch import save_file
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    h, inter, hd = args.hidden, args.intermediate, args.hidden // args.heads
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": h,
        "intermediate_size": inter, "num_hidden_layers": args.layers, "num_attention_heads": args.heads,
        "num_key_value_heads": args.kv_heads, "vocab_size": args.vocab, "max_position_embeddings": 16384,
        "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "tie_word_embeddings": True, "bos_token_id": 1,
        "eos_token_id": 2, "torch_dtype": "bfloat16", "head_dim": hd,
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config))
    gen = torch.Generator(device=args.device).manual_seed(0)

    def rand(*shape: int) -> torch.Tensor:
        w = torch.empty(shape, dtype=torch.bfloat16, device=args.device)
        return w.normal_(0, 0.02, generator=gen).cpu()

    weights = {"model.embed_tokens.weight": rand(args.vocab, h), "model.norm.weight": torch.ones(h)}
    q, kv = args.heads * hd, args.kv_heads * hd
    for i in range(args.layers):
        p = f"model.layers.{i}."
        weights |= {
            p + "input_layernorm.weight": torch.ones(h), p + "post_attention_layernorm.weight": torch.ones(h),
            p + "self_attn.q_proj.weight": rand(q, h), p + "self_attn.k_proj.weight": rand(kv, h),
            p + "self_attn.v_proj.weight": rand(kv, h), p + "self_attn.o_proj.weight": rand(h, q),
            p + "mlp.gate_proj.weight": rand(inter, h), p + "mlp.up_proj.weight": rand(inter, h),
            p + "mlp.down_proj.weight": rand(h, inter),
        }
    save_file({k: v.to(torch.bfloat16).contiguous() for k, v in weights.items()}, str(out / "model.safetensors"))
    vocab = {f"t{i}": i for i in range(args.vocab)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="t1", eos_token="t2", unk_token="t0").save_pretrained(out)
    return sum(v.numel() for k, v in weights.items() if k.endswith("proj.weight") or "embed" in k) * 2


def random_prompts(n: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab, (n, length), generator=g).tolist()


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def engine_benchmarks(model_dir: Path, weight_bytes: int, args: argparse.Namespace) -> dict:
    from radixgen.runtime.engine import Engine

    res: dict = {}
    common = dict(model=str(model_dir), dtype=args.dtype, device=args.device, max_total_tokens=args.kv_tokens,
                  max_running_requests=max(256, args.shared_n), chunked_prefill_size=8192)
    eng = Engine(**common)
    try:
        eng.generate(input_ids=random_prompts(4, 64, args.vocab, 99), sampling_params={"max_new_tokens": 4})
        prompts = random_prompts(args.prefill_n, args.prefill_len, args.vocab, 1)
        t = time.perf_counter()
        eng.generate(input_ids=prompts, sampling_params={"max_new_tokens": 1})
        res["prefill_tok_s"] = args.prefill_n * args.prefill_len / (time.perf_counter() - t)
        emit({"measure": "prefill", "tokens": args.prefill_n * args.prefill_len, "tok_s": res["prefill_tok_s"]})
        gen = {"temperature": 0, "max_new_tokens": args.new_tokens, "ignore_eos": True}
        outputs = {}
        for b in (1, 32, 256):
            batch = random_prompts(b, 32, args.vocab, 10 + b)
            eng.generate(input_ids=batch, sampling_params={"max_new_tokens": 1})  # prompts now cached
            t = time.perf_counter()
            outputs[b] = [o["output_ids"] for o in eng.generate(input_ids=batch, sampling_params=gen)]
            dt = time.perf_counter() - t
            res[f"decode_b{b}_tok_s"] = b * args.new_tokens / dt
            rec = {"measure": f"decode_b{b}", "tok_s": res[f"decode_b{b}_tok_s"], "step_ms": dt / args.new_tokens * 1e3}
            if b == 1:
                mean_len = 32 + args.new_tokens / 2
                kv_bytes = args.layers * 2 * args.kv_heads * (args.hidden // args.heads) * 2 * mean_len
                gbs = (weight_bytes + kv_bytes) / (dt / args.new_tokens) / 1e9
                res["decode_b1_gb_s"] = gbs
                rec |= {"weights_gb": weight_bytes / 1e9, "achieved_gb_s": gbs}
            emit(rec)
    finally:
        eng.shutdown()
    if args.device.startswith("cuda"):  # the same decodes launched kernel by kernel: speed and equal outputs
        eng = Engine(**common, disable_cuda_graph=True)
        try:
            for b in (1, 32):
                batch = random_prompts(b, 32, args.vocab, 10 + b)
                eng.generate(input_ids=batch, sampling_params={"max_new_tokens": 1})
                t = time.perf_counter()
                same = [o["output_ids"] for o in eng.generate(input_ids=batch, sampling_params=gen)] == outputs[b]
                res[f"eager_decode_b{b}_tok_s"] = b * args.new_tokens / (time.perf_counter() - t)
                res[f"graph_equals_eager_b{b}"] = same
                emit({"measure": f"decode_b{b}_no_cuda_graph", "tok_s": res[f"eager_decode_b{b}_tok_s"],
                      "same_greedy_outputs": same})
        finally:
            eng.shutdown()
    times = {}
    for cache in ("on", "off"):
        eng = Engine(**common, disable_radix_cache=cache == "off", disable_cuda_graph=True)  # prefill-bound
        try:
            prefix = random_prompts(1, args.shared_prefix, args.vocab, 5)[0]
            reqs = [prefix + tail for tail in random_prompts(args.shared_n, 64, args.vocab, 6)]
            eng.generate(input_ids=random_prompts(2, 64, args.vocab, 98), sampling_params={"max_new_tokens": 2})
            t = time.perf_counter()
            eng.generate(input_ids=reqs, sampling_params={"temperature": 0, "max_new_tokens": 16, "ignore_eos": True})
            times[cache] = time.perf_counter() - t
        finally:
            eng.shutdown()
        emit({"measure": f"shared_prefix_cache_{cache}", "requests": args.shared_n, "prefix": args.shared_prefix,
              "seconds": times[cache]})
    res["radix_speedup"] = times["off"] / times["on"]
    return res


def cuda_time_ms(fn, reps: int = 20) -> float:
    """Median time of fn() in ms from CUDA events."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end))
    return statistics.median(samples)


def extend_vs_sdpa(b: int, s: int, args: argparse.Namespace) -> float:
    """Time the Triton extend kernel and flash SDPA on b causal sequences of s tokens; return sdpa/ours."""
    import torch.nn.functional as F

    from radixgen.runtime.executor.forward_batch import make_forward_batch
    from radixgen.runtime.kernels.triton_attention import TritonAttentionMetadata, triton_attention

    dev, hd, n = args.device, args.hidden // args.heads, b * s
    q = torch.randn(n, args.heads, hd, device=dev, dtype=torch.bfloat16)  # [T, H, D]
    k = torch.randn(n + 1, args.kv_heads, hd, device=dev, dtype=torch.bfloat16)  # [N, Hkv, D]
    v = torch.randn_like(k)
    r2t = (torch.arange(n, device=dev) + 1).view(b, s)  # [B, S] contiguous slots
    fb = make_forward_batch([[0] * s] * b, [0] * b, list(range(b)), torch.arange(1, n + 1), device=dev)
    meta = TritonAttentionMetadata.build(fb, r2t)
    scale = hd**-0.5
    qd = q.view(b, s, args.heads, hd).transpose(1, 2)  # [B, H, S, D]
    group = args.heads // args.kv_heads  # K/V expanded to all heads: flash SDPA's plain layout
    kd = k[1:].view(b, s, args.kv_heads, hd).transpose(1, 2).repeat_interleave(group, 1)  # [B, H, S, D]
    vd = v[1:].view(b, s, args.kv_heads, hd).transpose(1, 2).repeat_interleave(group, 1)
    ours = cuda_time_ms(lambda: triton_attention(q, k, v, meta, scale))
    with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.FLASH_ATTENTION):
        ref = cuda_time_ms(lambda: F.scaled_dot_product_attention(qd, kd, vd, is_causal=True, scale=scale))
    flops = 4 * b * args.heads * hd * s * s / 2
    emit({"measure": f"extend_attention_b{b}_s{s}", "triton_ms": ours, "sdpa_flash_ms": ref,
          "triton_tflops": flops / ours / 1e9, "ratio_sdpa_over_triton": ref / ours})
    return ref / ours


def kernel_accuracy(args: argparse.Namespace) -> dict:
    """Triton vs torch-path max abs difference on mixed extend/decode batches, on this device."""
    from radixgen.runtime.executor.forward_batch import make_forward_batch
    from radixgen.runtime.kernels.triton_attention import TritonAttentionMetadata, triton_attention
    from radixgen.runtime.layers.attention.torch_backend import AttentionMetadata, attention

    dev, hd = args.device, args.hidden // args.heads
    res: dict = {}
    worst = 0.0
    for dtype, reqs in ((torch.float32, [(0, 300), (300, 7), (57, 1)]), (torch.float32, [(1000, 1), (3, 1)]),
                        (torch.bfloat16, [(2000, 64), (0, 1), (4000, 1)])):
        t = sum(e for _, e in reqs)
        q = torch.randn(t, args.heads, hd, device=dev, dtype=dtype)
        nk = sum(p + e for p, e in reqs) + 1
        k = torch.randn(nk, args.kv_heads, hd, device=dev, dtype=dtype)
        v = torch.randn_like(k)
        slots = torch.randperm(nk - 1) + 1
        r2t = torch.zeros(len(reqs), max(p + e for p, e in reqs), dtype=torch.int64)
        loc, at = [], 0
        for i, (p, e) in enumerate(reqs):
            r2t[i, : p + e] = slots[at : at + p + e]
            loc.append(slots[at + p : at + p + e])
            at += p + e
        fb = make_forward_batch([[0] * e for _, e in reqs], [p for p, _ in reqs], list(range(len(reqs))),
                                torch.cat(loc), device=dev)
        r2t = r2t.to(dev)
        ref = attention(q.float(), k.float(), v.float(), AttentionMetadata.build(fb, r2t), hd**-0.5)
        out = triton_attention(q, k, v, TritonAttentionMetadata.build(fb, r2t), hd**-0.5).float()
        diff = (out - ref).abs().max().item()
        emit({"measure": "triton_vs_torch_attention", "dtype": str(dtype), "reqs": reqs, "max_abs_diff": diff})
        worst = max(worst, diff) if dtype == torch.float32 else worst
    res["fp32_max_abs_diff"] = worst
    return res


def main() -> None:
    args = build_parser().parse_args()
    if args.tiny:
        args.hidden, args.intermediate, args.layers, args.heads, args.kv_heads, args.vocab = 128, 256, 2, 4, 2, 1024
        args.kv_tokens, args.new_tokens, args.prefill_n, args.prefill_len = 8192, 8, 2, 128
        args.shared_n, args.shared_prefix = 4, 256
    summary: dict = {"bench": "gpu", "device": args.device, "dtype": args.dtype,
                     "params_b": round((args.vocab * args.hidden + args.layers * (
                         args.hidden * (args.hidden + 2 * args.kv_heads * args.hidden // args.heads)
                         + args.hidden * args.hidden + 3 * args.hidden * args.intermediate)) / 1e9, 3)}
    if args.device.startswith("cuda"):
        if not torch.cuda.is_available():
            print(json.dumps({"bench": "gpu", "skipped": "no CUDA device; try --tiny --device cpu"}))
            return
        name = torch.cuda.get_device_name()
        peak = args.peak_gb_s or next((v for k, v in PEAK_GBS.items() if k in name), math.nan)
        summary |= {"gpu": name, "peak_gb_s": peak}
    with tempfile.TemporaryDirectory() as tmp:
        weight_bytes = build_random_llama(Path(tmp) / "model", args)
        summary |= engine_benchmarks(Path(tmp) / "model", weight_bytes, args)
    if args.device.startswith("cuda"):
        summary["decode_b1_bandwidth_fraction"] = summary["decode_b1_gb_s"] / summary["peak_gb_s"]
        summary |= {f"extend_b{b}_s{s}_ratio": extend_vs_sdpa(b, s, args) for b, s in ((4, 2048), (1, 8192))}
    if args.device.startswith("cuda") or os.environ.get("TRITON_INTERPRET") == "1":
        summary |= kernel_accuracy(args)
    emit(summary)


if __name__ == "__main__":
    main()
