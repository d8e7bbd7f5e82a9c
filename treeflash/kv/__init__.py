"""KV caches (dense and compressed) and recurrent-state caches, with commit after verification."""
