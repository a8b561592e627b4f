"""Regex-constrained fields: `gen(regex=...)` for a date, an email and a phone number, plus `gen_int` and
`gen(dtype=float)`. The constraint guarantees the format (a full match of the pattern); the model only
chooses the content, so even a 135M model returns values that parse.

Run: python examples/regex_fields.py
"""

import re

import radixgen as sgl

MONTHS = "(January|February|March|April|May|June|July|August|September|October|November|December)"
DATE = r"[1-9][0-9]? " + MONTHS + r" (19|20)[0-9]{2}"  # "14 March 2025", the note's own format
EMAIL = r"[a-z][a-z0-9.]{0,15}@[a-z][a-z0-9]{0,11}\.(com|org|net)"
PHONE = r"[0-9]{3}-[0-9]{3}-[0-9]{4}"
FIELD_TOKENS = 24  # more than any of these fields needs

NOTE = ("Hi team, the kickoff meeting is on 14 March 2025. Send questions to anna.berg@example.com "
        "or call her on 555-201-7788. We expect 12 people and the catering costs 310.50 dollars.")


@sgl.function
def extract_fields(s, note, field_tokens):
    s += sgl.user("Read the note and fill in the form.\n\n" + note)
    with s.assistant():
        # These patterns are bounded (they end after the last digit or the ".com"), so the model cannot
        # run on past the value even though it would like to write "\n" next, which they do not allow.
        s += "Date: " + sgl.gen("date", regex=DATE, max_tokens=field_tokens) + "\n"
        s += "Contact email: " + sgl.gen("email", regex=EMAIL, max_tokens=field_tokens) + "\n"
        s += "Phone: " + sgl.gen("phone", regex=PHONE, max_tokens=field_tokens)
    # int / float patterns are open-ended ("12" may go on as "120..."), so each number ends its own turn:
    # there the model's next wish is the end-of-turn token, which the constraint accepts.
    s += sgl.user("How many people are expected?")
    s += sgl.assistant("People: " + sgl.gen_int("people", max_tokens=field_tokens))  # = gen(dtype=int)
    s += sgl.user("What does the catering cost?")
    s += sgl.assistant("Cost in dollars: " + sgl.gen("cost", dtype=float, max_tokens=field_tokens))


def main(max_tokens: int | None = None) -> dict:
    """max_tokens: token budget per field (default 24); smaller budgets are raised to 24, which all these
    fields fit in. Returns the extracted fields (people as int, cost as float)."""
    engine = sgl.Engine()
    sgl.set_default_backend(engine)
    field_tokens = max(max_tokens or FIELD_TOKENS, FIELD_TOKENS)
    state = extract_fields.run(note=NOTE, field_tokens=field_tokens, temperature=0)
    state.sync()  # re-raises an error from inside the program, if any
    fields = {name: state[name] for name in ("date", "email", "phone", "people", "cost")}
    for name, pattern in (("date", DATE), ("email", EMAIL), ("phone", PHONE)):
        print(f"{name:6} {fields[name]!r:28} full match: {re.fullmatch(pattern, fields[name]) is not None}")
    # dtype=int / float values are text that int() / float() always accept.
    fields["people"], fields["cost"] = int(fields["people"]), float(fields["cost"])
    print(f"people {fields['people']!r:28} (int)\ncost   {fields['cost']!r:28} (float)")
    engine.shutdown()
    return fields


if __name__ == "__main__":
    main()
