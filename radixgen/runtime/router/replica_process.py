"""A data-parallel replica's process: `radixgen serve` that exits when the process that started it does."""

from __future__ import annotations

import os
import sys

from radixgen.runtime.cli import main
from radixgen.runtime.distributed.launch import exit_with_parent

if __name__ == "__main__":
    exit_with_parent()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main(["serve", *sys.argv[1:]])
