"""The speech pipeline: synthesis (tokens to frames to PCM), admission, measured capacity, and the
serving process.
"""
