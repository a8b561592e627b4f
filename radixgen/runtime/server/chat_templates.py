"""`--chat-template`: a Jinja file, or one of a few known templates by name, used instead of the
tokenizer's own (SGLang's flag; its names where it has the same template).

- `chatml`: `<|im_start|>role\\ncontent<|im_end|>\\n` turns, no default system prompt.
- `llama-3-instruct`: Llama 3's header turns, `<|start_header_id|>role<|end_header_id|>\\n\\n...<|eot_id|>`.
- `gemma-it`: Gemma's turns, `<start_of_turn>user\\n...<end_of_turn>\\n`, the assistant as `model`, a
  system message folded into the first user turn (Gemma has no system role). Also the template of a
  Gemma GGUF that carries none (`template_for_arch`).

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
    "gemma-it": (
        "{%- macro text(content) -%}"
        "{%- if content is string -%}{{ content }}"
        "{%- else -%}{%- for part in content if part['type'] == 'text' -%}{{ part['text'] }}{%- endfor -%}"
        "{%- endif -%}"
        "{%- endmacro -%}"
        "{{- bos_token }}"
        "{%- if messages and messages[0]['role'] == 'system' -%}"
        "{%- set first_prefix = text(messages[0]['content']) | trim + '\\n\\n' -%}"
        "{%- set turns = messages[1:] -%}"
        "{%- else -%}{%- set first_prefix = '' -%}{%- set turns = messages -%}{%- endif -%}"
        "{%- for message in turns -%}"
        "{{- '<start_of_turn>' + ('model' if message['role'] == 'assistant' else message['role']) + '\\n' }}"
        "{{- (first_prefix if loop.first else '') + text(message['content']) | trim + '<end_of_turn>\\n' }}"
        "{%- endfor -%}"
        "{%- if add_generation_prompt -%}{{- '<start_of_turn>model\\n' }}{%- endif -%}"
    ),
}
ARCH_TEMPLATES = {"gemma3": "gemma-it"}  # for a GGUF of this architecture that carries no chat template


def template_for_arch(arch: str | None) -> str | None:
    """The known template a model of `arch` is trained on, for files that carry none (None: not known)."""
    name = ARCH_TEMPLATES.get(arch or "")
    return KNOWN_TEMPLATES[name] if name else None


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
