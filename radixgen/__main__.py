"""`python -m radixgen ...`: the `radixgen` command (radixgen/runtime/cli.py)."""

from radixgen.runtime.cli import main

if __name__ == "__main__":
    main()
