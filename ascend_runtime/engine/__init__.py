"""What the supported vLLM / vLLM-Ascend releases actually read (engine surfaces) and checks against it."""
