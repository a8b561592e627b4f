"""JSON extraction: a pydantic model becomes a JSON-schema constraint on `gen`.

Run: python examples/json_extract.py   (or `make demo`)
"""

import json
import time

from pydantic import BaseModel, Field

import radixgen as sgl


class Person(BaseModel):
    name: str = Field(max_length=30)
    age: int = Field(ge=0, le=130)
    city: str = Field(max_length=30)


@sgl.function
def extract(s, text):
    s += sgl.user(f"Extract the person described here as JSON with name, age and city.\n\n{text}")
    s += sgl.assistant(sgl.gen("person", json_schema=Person, max_tokens=64))


def main() -> None:
    engine = sgl.Engine()
    sgl.set_default_backend(engine)
    texts = [
        "Maria Lopez, 34, moved to Madrid last spring to open a bakery.",
        "Our new neighbour is Tom Baker; he is 71 and lives in Leeds.",
    ]
    t0 = time.perf_counter()
    states = extract.run_batch([{"text": t} for t in texts], temperature=0, progress_bar=False)
    for state in states:
        state.sync()
        person = Person.model_validate(json.loads(state["person"]))
        meta = state.get_meta_info("person")
        print(f"{person!r}  (prompt={meta['prompt_tokens']} cached={meta['cached_tokens']})")
    print(f"{len(texts)} extractions in {time.perf_counter() - t0:.1f} s, each validated by pydantic")
    engine.shutdown()


if __name__ == "__main__":
    main()
