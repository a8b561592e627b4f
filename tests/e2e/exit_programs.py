"""SGLang-style programs in one script, run as a subprocess by test_clean_exit.py: gen, select, a regex
gen, fork/join, run_batch, a streamed program, and at the end work still in flight (a streaming
program read only up to its first chunk, a fork never joined), as a user's script may leave it.

Run: python tests/e2e/exit_programs.py (on the default model; the test gives it a tiny one).
"""

import radixgen as sgl


@sgl.function
def answer(s, question):
    s += sgl.system("You are terse.")
    s += sgl.user(question)
    s += sgl.assistant(sgl.gen("answer", max_tokens=12, stop="\n"))


@sgl.function
def classify(s, text):
    s += sgl.user(f"Is this positive or negative? {text}")
    s += sgl.assistant(sgl.select("label", choices=["positive", "negative"]))


@sgl.function
def year(s, event):
    s += sgl.user(f"In which year did {event} happen?")
    s += sgl.assistant("Year: " + sgl.gen("year", regex=r"(19|20)[0-9]{2}"))


@sgl.function
def facts(s, topic):
    s += sgl.user(f"Name facts about {topic}.")
    forks = s.fork(2)
    forks += lambda i: sgl.assistant(sgl.gen("fact", max_tokens=6))
    forks.join()


@sgl.function
def story(s, topic):
    s += sgl.user(f"Tell a story about {topic}.")
    s += sgl.assistant(sgl.gen("story", max_tokens=40))
    s += sgl.user("Was it happy?")
    s += sgl.assistant(sgl.select("happy", choices=["yes", "no"]))


sgl.set_default_backend(sgl.Engine())

print(answer.run(question="What is the capital of France?", temperature=0)["answer"])
print(classify.run(text="I loved it.")["label"])
print(year.run(event="the moon landing")["year"])
print(facts.run(topic="owls", temperature=0)["fact"])
for state in answer.run_batch([{"question": f"What is {i} + {i}?"} for i in range(3)], temperature=0):
    print(state["answer"])

streamed = story.run(topic="a lighthouse", stream=True)
for chunk in streamed.text_iter("story"):
    print(chunk, end="", flush=True)
print()

# Left in flight at exit: a fork never joined, and a streaming program read up to its first chunk.
base = answer.run(question="Name a colour.", temperature=0)
branches = base.fork(2)
branches += lambda i: sgl.user("Why?") + sgl.assistant(sgl.gen("why", max_tokens=16))
pending = story.run(topic="a harbour", stream=True)
next(iter(pending.text_iter("story")))
print("done")
