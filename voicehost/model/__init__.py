"""The model: Orpheus's token format, the SNAC codec, position-constrained sampling, the vLLM
engine and the dev model.
"""
