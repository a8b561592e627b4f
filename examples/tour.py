"""A tour of the language (the README's tour, as a file). Run: python examples/tour.py"""

from pydantic import BaseModel, Field

import radixgen as sgl


@sgl.function
def qa(s, question):
    s += sgl.system("You are terse.")
    s += sgl.user(question)
    s += sgl.assistant(sgl.gen("answer", max_tokens=24, stop="\n"))
    s += sgl.user("Is that a place, a person or a thing?")
    s += sgl.assistant(sgl.select("kind", choices=["a place", "a person", "a thing"]))


class City(BaseModel):
    name: str = Field(max_length=20)
    country: str = Field(max_length=20)
    is_capital: bool


@sgl.function
def city_card(s, city):
    s += sgl.user(f"Describe {city} as JSON.")
    s += sgl.assistant(sgl.gen("card", json_schema=City, max_tokens=48))


sgl.set_default_backend(sgl.Engine())  # default model: SmolLM2-135M-Instruct

state = qa.run(question="What is the capital of France?", temperature=0)
print(state["answer"], "|", state["kind"], "| cached tokens:", state.get_meta_info("kind")["cached_tokens"])

forks = state.fork(3)  # three branches share the text so far: its KV is computed once (radix cache)
forks += lambda i: sgl.user(f"Give fact {i + 1} about it.") + sgl.assistant(sgl.gen("fact", max_tokens=12))
forks.join()  # state["fact"] is now a list of 3
print(state["fact"])

questions = ["What is the capital of Japan?", "What is the capital of Peru?"]
for st in qa.run_batch([{"question": q} for q in questions], temperature=0):
    print(st["answer"], "|", st["kind"])

card = City.model_validate_json(city_card.run(city="Tokyo", temperature=0)["card"])
print(card)

s = qa.run(question="Name a famous painter.", temperature=0, stream=True)
for chunk in s.text_iter("answer"):  # text as it is generated
    print(chunk, end="", flush=True)
print()
