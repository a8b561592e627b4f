"""RadixAttention: a prefix tree over a token-granular KV pool."""
