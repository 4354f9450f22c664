"""Cloning: clone jobs and their queue, a candidate voice measured through the engine, and the
evaluation gate.
"""
