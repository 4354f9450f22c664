"""Tools around the service: doctor, the dev server harness, the dev speech corpus and the
benchmark client.
"""
