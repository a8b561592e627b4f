"""`--chat-template`: a Jinja file, or one of a few known templates by name, used instead of the
tokenizer's own (SGLang's flag; its names where it has the same template).

- `chatml`: `<|im_start|>role\\ncontent<|im_end|>\\n` turns, no default system prompt.
- `llama-3-instruct`: Llama 3's header turns, `<|start_header_id|>role<|end_header_id|>\\n\\n...<|eot_id|>`.

Both are written from the formats' published descriptions; a model's own template (tools, default
system prompts, thinking switches) stays the better choice where it has one.
"""

from __future__ import annotations

from pathlib import Path

KNOWN_TEMPLATES: dict[str, str] = {
    "chatml": (
        "{%- for message in messages %}"
        "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
        "{%- endfor %}"
        "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
    ),
    "llama-3-instruct": (
        "{{- bos_token }}"
        "{%- for message in messages %}"
        "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim"
        " + '<|eot_id|>' }}"
        "{%- endfor %}"
        "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
    ),
}


def load_chat_template(spec: str) -> str:
    """The Jinja text of `spec`: a known template's name or the path of a Jinja file (ValueError otherwise)."""
    if spec in KNOWN_TEMPLATES:
        return KNOWN_TEMPLATES[spec]
    path = Path(spec).expanduser()
    if not path.is_file():
        raise ValueError(f"chat template {spec!r} is neither a file nor a known template "
                         f"({', '.join(KNOWN_TEMPLATES)})")
    text = path.read_text(encoding="utf-8")
    if not text.strip():
        raise ValueError(f"chat template file {spec!r} is empty")
    return text
