"""Checks that the torch device an engine is asked for exists, with a message saying what to do."""

from __future__ import annotations


def check_device(device: str) -> None:
    """Raise ValueError unless `device` ("cpu", "cuda", "cuda:N") can run here."""
    import torch

    try:
        dev = torch.device(device)
    except RuntimeError:
        raise ValueError(f"device {device!r} is not a torch device: use 'cpu' or 'cuda' (or 'cuda:N')") from None
    if dev.type == "cpu":
        return
    if dev.type != "cuda":
        raise ValueError(f"device {device!r} is not supported: radixgen runs on 'cpu' or 'cuda'")
    if torch.version.cuda is None and torch.version.hip is None:
        raise ValueError(f"device {device!r} is not available: this torch ({torch.__version__}) is a CPU-only build; "
                         f"install a CUDA build of torch (see the README's Install section) or use --device cpu")
    if not torch.cuda.is_available():
        raise ValueError(f"device {device!r} is not available: torch {torch.__version__} sees no GPU (check the "
                         f"driver with nvidia-smi and CUDA_VISIBLE_DEVICES), or use --device cpu")
    if dev.index is not None and dev.index >= torch.cuda.device_count():
        raise ValueError(f"device {device!r} is not available: {torch.cuda.device_count()} GPU(s) visible")
