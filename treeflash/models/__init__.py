"""Target architectures (llama, qwen2, qwen3, qwen3_5 hybrid) and their loaders."""
