"""Normalisation rules of the languages other than English, one module per language or family:
``european`` (fr, de, es, it: one set of rules over each language's words and number writing),
``korean``, ``hindi`` and ``chinese``. Each gives ``normalize(text) -> str`` for one segment;
``voicehost.text.normalize.normalizer`` picks one by a BCP-47 tag.
"""
