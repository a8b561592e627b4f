"""Parallel tool calls with fork: each branch picks the argument of its own (local, Python) tool, the
tools run concurrently in a thread pool, each branch reads its tool's result, and join gathers them.

The tools sleep a little to stand in for network calls; because they run at the same time, the tool
phase takes about as long as the slowest tool instead of the sum of all.

Run: python examples/parallel_tools.py
"""

import time
from concurrent.futures import ThreadPoolExecutor

import radixgen as sgl

CITIES = ["Paris", "Tokyo", "Cairo", "Lima"]
TOOL_LATENCY_S = 0.3


def weather(city: str) -> str:
    time.sleep(TOOL_LATENCY_S)
    return {"Paris": "12 C and rain", "Tokyo": "18 C and sunny", "Cairo": "30 C and dry",
            "Lima": "20 C and cloudy"}[city]


def local_time(city: str) -> str:
    time.sleep(TOOL_LATENCY_S)
    return {"Paris": "UTC+1", "Tokyo": "UTC+9", "Cairo": "UTC+2", "Lima": "UTC-5"}[city]


def currency(city: str) -> str:
    time.sleep(TOOL_LATENCY_S)
    return {"Paris": "euro (EUR)", "Tokyo": "yen (JPY)", "Cairo": "Egyptian pound (EGP)",
            "Lima": "sol (PEN)"}[city]


TOOLS = [("weather", weather), ("time zone", local_time), ("currency", currency)]


@sgl.function
def trip_briefing(s, request, timings):
    s += sgl.system("You are a travel assistant with tools for weather, time zone and currency.")
    s += sgl.user(request)
    forks = s.fork(len(TOOLS))  # one branch per tool; the conversation so far is computed once
    # Each branch chooses its tool's argument: the city of the request, picked among CITIES.
    forks += lambda i: sgl.assistant(f"Calling the {TOOLS[i][0]} tool for the city: "
                                     + sgl.select("city", choices=CITIES))

    def call(i: int) -> str:
        city = forks[i]["city"]  # waits for branch i's select only, not for the other branches
        start = time.perf_counter()
        result = TOOLS[i][1](city)
        timings.append((start, time.perf_counter()))
        return result

    with ThreadPoolExecutor(len(TOOLS)) as pool:  # the tools run at the same time
        results = list(pool.map(call, range(len(TOOLS))))
    for i, result in enumerate(results):
        forks[i]["tool_result"] = result  # a plain Python value stored as a branch variable
        forks[i] += sgl.user(f"The {TOOLS[i][0]} tool says: {result}. Give the traveller one short tip.")
        forks[i] += sgl.assistant(sgl.gen("tip", stop="\n"))
    forks.join()  # gather_variable: s["city"], s["tool_result"] and s["tip"] become lists, one per branch


def main(max_tokens: int | None = None) -> dict:
    """max_tokens: budget of each branch's tip (default 40). Returns the gathered results."""
    engine = sgl.Engine()
    sgl.set_default_backend(engine)
    timings: list[tuple[float, float]] = []  # (start, end) of each tool call
    t0 = time.perf_counter()
    state = trip_briefing.run(request="I am flying to Tokyo tomorrow. What should I know?", timings=timings,
                              max_new_tokens=max_tokens or 40, temperature=0)
    state.sync()  # re-raises an error from inside the program (or a branch), if any
    elapsed = time.perf_counter() - t0
    for (name, _), city, result, tip in zip(TOOLS, state["city"], state["tool_result"], state["tip"], strict=True):
        print(f"{name:9} ({city}): {result}\n          tip: {tip.strip()}")
    busy = sum(end - start for start, end in timings)
    span = max(end for _, end in timings) - min(start for start, _ in timings)
    print(f"{len(timings)} tool calls: {busy:.1f} s of tool time in {span:.1f} s of wall time (concurrent); "
          f"the whole program took {elapsed:.1f} s")
    engine.shutdown()
    return {"cities": state["city"], "results": state["tool_result"], "tips": state["tip"], "timings": timings}


if __name__ == "__main__":
    main()
