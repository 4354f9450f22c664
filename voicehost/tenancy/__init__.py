"""Tenants: API keys, the audit trail, usage metering and the pronunciation-lexicon store."""
