"""Gemma 3 against HF transformers: a tiny random-weight model (sliding-window layers past their
window, their own rotary base, q/k norms, sandwich norms, GeGLU, scaled embedding, soft-capped
logits) from safetensors and from its GGUF conversion (HF reads that file with its own GGUF loader),
through prefill, split extends, decode and the engine's chunked prefill and radix cache; then the
public Gemma 3 270M Q4_K_M file itself."""

from __future__ import annotations

import json

import pytest
import torch

from radixgen.runtime.engine import Engine
from radixgen.runtime.models.resolve import cache_dir_for
from radixgen.runtime.tokenizer import load_tokenizer
from tests.conftest import build_tiny_model
from tests.runtime.test_model_logits import PROMPT, check_model

LONG = " ".join([PROMPT] * 3)  # ~60 tokens: past the tiny model's 16-token window


@pytest.fixture(scope="module")
def tiny_gemma(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("gemma3"), "gemma3")


@pytest.mark.parametrize("attention_backend", ["torch", "triton"])
def test_tiny_gemma3_matches_hf_past_the_window(tiny_gemma, attention_backend):
    ids = load_tokenizer(tiny_gemma).encode(LONG)
    assert len(ids) > 3 * 16
    check_model(tiny_gemma, ids, attention_backend=attention_backend)


def test_engine_chunked_prefill_and_radix_cache_past_the_window(tiny_gemma):
    """Requests sharing a prefix longer than the window, prefilled in chunks shorter and longer than
    it, run together and one after another (the second from the radix cache), and with n-gram drafts
    verified past the window (every proposed draft kept): greedy ids equal HF's."""
    import transformers

    from radixgen.runtime.scheduler.speculator import StepCosts

    tok = load_tokenizer(tiny_gemma)
    prompts = [LONG + tail for tail in (" Spain", " The capital of Japan", " And so on and so forth")]
    ref = transformers.AutoModelForCausalLM.from_pretrained(str(tiny_gemma), dtype=torch.float32).eval()
    expected = []
    with torch.no_grad():
        for p in prompts:
            ids = torch.tensor([tok.encode(p)])
            expected.append(ref.generate(ids, max_new_tokens=24, do_sample=False)[0, ids.shape[1]:].tolist())
    for chunk, spec in ((12, "none"), (40, "none"), (40, "ngram")):
        eng = Engine(model=str(tiny_gemma), chunked_prefill_size=chunk, max_total_tokens=2048, num_threads=1,
                     speculative_algorithm=spec)
        if spec == "ngram":
            eng.scheduler.speculator.costs = StepCosts(1e9, learn=False)  # rows cost nothing: draft what is found
        try:
            params = {"max_new_tokens": 24, "temperature": 0, "ignore_eos": True}
            together = eng.generate(prompts, params)
            again = [eng.generate(p, params) for p in prompts]  # from the radix cache
            assert again[1]["meta_info"]["cached_tokens"] > 16
            if spec == "ngram":
                assert sum(o["meta_info"]["spec_num_proposed_drafts"] for o in together + again) > 0
        finally:
            eng.shutdown()
        assert [o["output_ids"] for o in together] == expected
        assert [o["output_ids"] for o in again] == expected


def test_rotary_tables_end_at_the_kv_pool_and_its_last_slot_decodes_right(tiny_gemma):
    """The rotary tables (global and local) cover the positions the KV pool can hold, not the model's
    maximum; a request that fills the pool to its last slot still decodes HF's greedy ids there."""
    import transformers

    tok = load_tokenizer(tiny_gemma)
    prompt = LONG + " And so on and so forth"
    ids = tok.encode(prompt)
    ref = transformers.AutoModelForCausalLM.from_pretrained(str(tiny_gemma), dtype=torch.float32).eval()
    with torch.no_grad():
        expected = ref.generate(torch.tensor([ids]), max_new_tokens=24, do_sample=False)[0, len(ids):].tolist()
    pool = len(ids) + 24  # the 24th new token is sampled from the row at position pool - 1
    eng = Engine(model=str(tiny_gemma), max_total_tokens=pool, num_threads=1)
    try:
        model = eng.runner.model
        assert ref.config.max_position_embeddings > pool + 1
        for rotary in (model.rotary, model.local_rotary):
            assert rotary.cos.shape[0] == rotary.sin.shape[0] == pool + 1
        out = eng.generate(prompt, {"max_new_tokens": 24, "temperature": 0, "ignore_eos": True})
        assert out["output_ids"] == expected
    finally:
        eng.shutdown()


# Gemma 3 270M Q4_K_M's mix: the embedding Q8_0, q/k/gate/up Q5_0, v Q8_0, o Q4_K, down Q6_K
Q4_K_M_MIX = {"token_embd": "Q8_0", "attn_v": "Q8_0", "attn_output": "Q4_K", "ffn_down": "Q6_K"}


def test_tiny_gemma3_gguf_matches_hf_gguf_loader(tmp_path):
    """A GGUF as llama.cpp's converter writes one (its tensor names, 1 + w norms, the window in metadata,
    the layer pattern and the local rotary base implied), in the 270M file's quant mix: HF reads it with
    its own GGUF loader; the logits agree past the window."""
    from tests.runtime.gguf_models import VOCAB, write_tiny_gemma3_gguf

    path = write_tiny_gemma3_gguf(tmp_path / "gemma3.gguf", Q4_K_M_MIX, "Q5_0")
    ids = torch.randint(3, VOCAB, (60,), generator=torch.Generator().manual_seed(0)).tolist()
    check_model(path, ids)


STORY = ("The lighthouse keeper on the northern island kept a logbook of every ship that passed. "
         "In spring the fishing boats came first, then the ferries, and in summer the sailing yachts. ")
PROMPTS = ["The capital of France is", "def fibonacci(n):", "Write a JSON object with a name and an age:",
           STORY * 18 + "The keeper wrote that the last ship of the year was"]  # ~660 tokens: past the 512 window


@pytest.fixture(scope="module")
def gemma3_engine(gemma3_path):
    eng = Engine(model=str(gemma3_path), max_total_tokens=8192)
    yield eng
    eng.shutdown()


def test_gemma3_270m_greedy_equals_hf(gemma3_path, gemma3_engine):
    """The public file: greedy continuations equal HF transformers' on the same file (HF's own GGUF
    loader), one prompt past the 512-token window of its local layers."""
    import transformers

    tok = gemma3_engine.tokenizer
    ours = [gemma3_engine.generate(p, {"max_new_tokens": 24, "temperature": 0})["output_ids"] for p in PROMPTS]
    assert len(tok.encode(PROMPTS[-1])) > 512
    ref = transformers.AutoModelForCausalLM.from_pretrained(str(gemma3_path.parent), gguf_file=gemma3_path.name,
                                                            dtype=torch.float32).eval()
    with torch.no_grad():
        for p, out in zip(PROMPTS, ours, strict=True):
            ids = torch.tensor([tok.encode(p)])
            expected = ref.generate(ids, max_new_tokens=24, do_sample=False)[0, ids.shape[1]:].tolist()
            assert out == expected[: len(out)], (p[:40], tok.decode(out), tok.decode(expected))


def test_gemma3_270m_json_schema_output_is_valid(gemma3_engine):
    """Constrained decoding over the 262k vocabulary: the output parses and validates."""
    import json

    import jsonschema

    schema = {"type": "object", "additionalProperties": False, "required": ["name", "age", "city"],
              "properties": {"name": {"type": "string", "maxLength": 20}, "age": {"type": "integer"},
                             "city": {"type": "string", "maxLength": 20}}}
    outs = gemma3_engine.generate(["A person as JSON:", "Marie is 31 and lives in Lyon. As JSON:"],
                                  {"max_new_tokens": 80, "temperature": 0, "json_schema": json.dumps(schema)})
    for o in outs:
        assert o["meta_info"]["finish_reason"]["type"] == "stop", o
        jsonschema.validate(json.loads(o["text"]), schema)


def test_gemma3_270m_turns_end_at_end_of_turn(gemma3_engine):
    """The file lists only <eos> as its end; a chat reply ends at <end_of_turn> too (its template's turn end)."""
    tok = gemma3_engine.tokenizer
    end = tok.hf.convert_tokens_to_ids("<end_of_turn>")
    assert end in tok.eos_token_ids and 1 in tok.eos_token_ids
    prompt = tok.apply_chat_template([{"role": "user", "content": "Hi"}])
    assert prompt == "<bos><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n"


TOKENIZER_TEXTS = ["The capital of France is", " leading space and  two", "<start_of_turn>user\nhi<end_of_turn>\n",
                   "日本語のテキスト 🎉 naïve café", "a\n\n  b\tc\r\n", '{"k": [1, 2.5e-3, null]}', STORY]


@pytest.mark.parametrize("which", ["gemma3", "smollm2"])
def test_gguf_tokenizer_from_its_cache_equals_hf_gguf_loader(which, gemma3_path, smollm2_path):
    """The tokenizer we load from a GGUF file (from its cached tokenizer.json, through the generic fast
    class) encodes, decodes and names its special and added tokens as HF's own GGUF loader does on the
    same file, and holds no Python copy of the vocabulary or merges (0.2 GB for Gemma 3's 262k tokens)."""
    import transformers

    path = gemma3_path if which == "gemma3" else smollm2_path
    load_tokenizer(path)  # the first load converts and caches; the second reads the cache
    ours = load_tokenizer(path)
    ref = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    for text in TOKENIZER_TEXTS:
        for special in (True, False):
            ids = ours.encode(text, add_special_tokens=special)
            assert ids == ref.encode(text, add_special_tokens=special), (text, special)
            for skip in (True, False):
                assert ours.decode(ids, skip_special_tokens=skip) == ref.decode(ids, skip_special_tokens=skip)
    assert ours.vocab_size == len(ref)
    assert ref.eos_token_id in ours.eos_token_ids
    for name in ("bos_token_id", "pad_token_id", "unk_token_id"):
        assert getattr(ours.hf, name) == getattr(ref, name), name
    assert not getattr(ours.hf, "_vocab", None) and not getattr(ours.hf, "_merges", None)
    state = lambda decoder: {i: t.__getstate__() for i, t in decoder.items()}
    assert state(ours.hf.added_tokens_decoder) == state(ref.added_tokens_decoder)
    # listed in the cached config, so that loading does not parse the whole tokenizer.json in Python for them
    config = json.loads((cache_dir_for(path) / "tokenizer" / "tokenizer_config.json").read_text(encoding="utf-8"))
    assert len(config["added_tokens_decoder"]) == len(ref.added_tokens_decoder) > 0


@pytest.mark.parametrize("which", ["gemma3", "smollm2"])
def test_token_bytes_spell_the_text_their_tokens_encode(which, gemma3_path, smollm2_path):
    """The byte table the outlines backend and budget-aware mode read: the bytes of a text's tokens, joined,
    are the text's UTF-8, through Gemma 3's SentencePiece pieces and byte-fallback tokens (one byte of a
    multi-byte character each: decoded alone they are U+FFFD) and SmolLM2's byte-level alphabet."""
    from radixgen.grammar.vocab import token_bytes_table

    tok = load_tokenizer(gemma3_path if which == "gemma3" else smollm2_path)
    table = token_bytes_table(tok.hf, tok.vocab_size)
    text = 'Hieroglyph \U00013000 and 日本語 café ŋ\n\t{"k": [1, 2.5]}  end'
    ids = tok.encode(text, add_special_tokens=False)
    assert b"".join(table[i] for i in ids) == text.encode("utf-8")
    byte_tokens = [i for i in ids if tok.hf.convert_ids_to_tokens(i).startswith("<0x")]
    assert bool(byte_tokens) == (which == "gemma3")  # the hieroglyph falls back to bytes in Gemma's vocabulary
    assert all(table[i] is None for i in tok.eos_token_ids if i < tok.vocab_size)  # special tokens spell nothing
