"""EBNF grammars through the engine API: `engine.generate(prompt, {"ebnf": grammar, ...})`.

A GBNF-style grammar (rules `name ::= ...`, the start rule is `root`) constrains the output token by
token, like `regex` / `json_schema` do. Two small grammars here: an arithmetic expression (checked by
evaluating it with `ast`) and a "Yes/No, because ..." answer. The language's `gen` has no `ebnf`
argument (it takes `regex`, `json_schema`, `choices` and `dtype`), so this example calls the engine
directly, rendering the chat prompt with the tokenizer's chat template.

Run: python examples/ebnf_grammar.py
"""

import ast
import re

import radixgen as sgl

ARITHMETIC = r"""
root   ::= expr
expr   ::= term (" " [-+] " " term)*
term   ::= factor (" " [*/] " " factor)*
factor ::= number | "(" expr ")"
number ::= [1-9] [0-9]? | "0"
"""

YES_NO = r"""
root   ::= answer ", because " reason "."
answer ::= "Yes" | "No"
reason ::= [a-z] [a-z ,']*
"""
YES_NO_REGEX = r"(Yes|No), because [a-z][a-z ,']*\."  # the same language, to check the outputs


def evaluate(expression: str) -> float:
    """The value of an expression of the ARITHMETIC grammar (walks the ast: no eval)."""
    ops = {ast.Add: float.__add__, ast.Sub: float.__sub__, ast.Mult: float.__mul__, ast.Div: float.__truediv__}

    def walk(node: ast.AST) -> float:
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return float(node.value)
        if isinstance(node, ast.BinOp) and type(node.op) in ops:
            return ops[type(node.op)](walk(node.left), walk(node.right))
        raise ValueError(f"unexpected {type(node).__name__}")

    return walk(ast.parse(expression, mode="eval").body)


def main(max_tokens: int | None = None) -> list[dict]:
    """max_tokens: budget of each completion (default 48). Returns one dict per prompt: grammar name,
    text and finish reason."""
    engine = sgl.Engine()
    tok = engine.tokenizer

    def chat(question: str) -> str:  # the chat template, as the language's roles would render it
        return tok.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True)

    jobs = [
        ("arithmetic", ARITHMETIC, "Write an arithmetic expression whose value is 12, like 3 * 4."),
        ("arithmetic", ARITHMETIC, "Write a sum of three small numbers."),
        ("yes/no", YES_NO, "Is the sun a star? Answer yes or no and give the reason."),
        ("yes/no", YES_NO, "Can fish fly? Answer yes or no and give the reason."),
    ]
    budget = max_tokens or 48
    # One batched call: a list of prompts with one sampling-params dict each (the grammars compile once).
    outputs = engine.generate([chat(q) for _, _, q in jobs],
                              [{"ebnf": grammar, "max_new_tokens": budget, "temperature": 0} for _, grammar, _ in jobs])
    results = []
    for (name, _, question), out in zip(jobs, outputs, strict=True):
        text, finish = out["text"], out["meta_info"]["finish_reason"]["type"]
        print(f"[{name}] {question}\n  -> {text!r}  (finish: {finish})")
        if finish == "length":
            print(f"  (cut off by the {budget}-token budget: a prefix of a valid output)")
        elif name == "arithmetic":
            try:
                print(f"  = {evaluate(text):g}")
            except ZeroDivisionError:
                print("  = undefined (division by zero)")
        else:
            print(f"  matches {YES_NO_REGEX!r}: {re.fullmatch(YES_NO_REGEX, text) is not None}")
        results.append({"grammar": name, "text": text, "finish": finish})
    engine.shutdown()
    return results


if __name__ == "__main__":
    main()
