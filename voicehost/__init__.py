"""voicehost: self-hosted voice-cloning TTS (Orpheus on vLLM, many LoRA voices per engine)."""

__version__ = "0.1.0"
