"""Backends of the program language: in-process Engine, RuntimeEndpoint (HTTP), OpenAI-compatible."""

from radixgen.lang.backends.base import Backend, ChatTemplate, Context
from radixgen.lang.backends.default import as_backend, get_default_backend, set_default_backend

__all__ = ["Backend", "as_backend", "ChatTemplate", "Context", "get_default_backend", "set_default_backend"]
