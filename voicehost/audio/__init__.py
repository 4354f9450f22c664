"""Audio: response formats and their encoders, tempo, where speech starts, and the speaker
embedder.
"""
