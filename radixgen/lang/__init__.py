"""The program language (frontend): `@function` programs of gen / select / fork and their interpreter."""

from radixgen.lang.api import (
    Function,
    assistant,
    assistant_begin,
    assistant_end,
    flush_cache,
    function,
    gen,
    gen_int,
    gen_string,
    get_default_backend,
    get_server_info,
    greedy_token_selection,
    select,
    separate_reasoning,
    set_default_backend,
    system,
    system_begin,
    system_end,
    token_length_normalized,
    unconditional_likelihood_normalized,
    user,
    user_begin,
    user_end,
)
from radixgen.lang.global_config import global_config
from radixgen.lang.interpreter import ProgramError, ProgramState, ProgramStateGroup
from radixgen.lang.ir import REGEX_BOOL, REGEX_FLOAT, REGEX_INT, REGEX_STR

__all__ = [
    "REGEX_BOOL", "REGEX_FLOAT", "REGEX_INT", "REGEX_STR", "flush_cache", "get_server_info", "global_config",
    "Function", "ProgramError", "ProgramState", "ProgramStateGroup", "assistant", "assistant_begin",
    "assistant_end", "function", "gen", "gen_int", "gen_string", "get_default_backend",
    "greedy_token_selection", "select", "separate_reasoning", "set_default_backend", "system", "system_begin",
    "system_end",
    "token_length_normalized", "unconditional_likelihood_normalized", "user", "user_begin", "user_end",
]
