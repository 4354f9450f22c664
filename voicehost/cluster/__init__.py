"""Cluster mode: workers, gateways and the Redis state that connects them."""
