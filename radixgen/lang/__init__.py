"""The program language (frontend): `@function` programs of gen / select / fork and their interpreter."""

from radixgen.lang.api import (
    Function,
    assistant,
    assistant_begin,
    assistant_end,
    function,
    gen,
    gen_int,
    gen_string,
    get_default_backend,
    greedy_token_selection,
    select,
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
from radixgen.lang.interpreter import ProgramError, ProgramState, ProgramStateGroup

__all__ = [
    "Function", "ProgramError", "ProgramState", "ProgramStateGroup", "assistant", "assistant_begin",
    "assistant_end", "function", "gen", "gen_int", "gen_string", "get_default_backend",
    "greedy_token_selection", "select", "set_default_backend", "system", "system_begin", "system_end",
    "token_length_normalized", "unconditional_likelihood_normalized", "user", "user_begin", "user_end",
]
