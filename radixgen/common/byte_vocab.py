"""GPT-2's byte-to-unicode table, which byte-level BPE vocabularies (GPT-2, Llama 3, SmolLM2, Qwen)
use to spell raw bytes as printable characters in their token strings."""

from __future__ import annotations


def gpt2_byte_decoder() -> dict[str, int]:
    """Inverse of GPT-2's bytes-to-unicode table: the printable stand-in character byte-level BPE
    vocabularies use for each byte -> that byte's value."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table, shifted = {chr(b): b for b in keep}, 0
    for b in range(256):
        if b not in keep:
            table[chr(256 + shifted)] = b
            shifted += 1
    return table
