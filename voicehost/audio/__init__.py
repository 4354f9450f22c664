"""Audio: response formats and where they are encoded, tempo, where speech starts, and the speaker
embedder.
"""
