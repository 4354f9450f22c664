"""voicehost in other frameworks' terms (each needs that framework installed)."""
