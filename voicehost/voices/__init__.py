"""Voices: the voice type and `voice@n`, the voice folders on disk, adapter validation and consent
records.
"""
