"""Execution: a scheduled batch becomes model inputs (`forward_batch`), logits (`model_runner`,
`cuda_graph`) and sampled tokens (`worker`, on its own thread)."""
