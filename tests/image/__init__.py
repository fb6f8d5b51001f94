"""The patched vLLM image's plugin, on real tensors and vLLM's own wheels."""
