"""Model building blocks with a choice of implementation: linear layers per weight representation
and attention backends over the token KV pool."""
