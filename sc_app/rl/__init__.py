"""The policy: tiny causal LM, the default task and its reward, the prompt loader, trainer and generation workers."""
