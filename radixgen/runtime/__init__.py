"""The serving engine: model, KV pools, scheduler, sampler and grammar integration."""
