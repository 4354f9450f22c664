"""Training LoRA voices from a few minutes of audio (components; the CLI composes them)."""
