"""Text: tokenizers (one contract, each kind its module, tokenizers.py opening a bundle's), the text
policy every door shares (text_policy.py), line streams (text_lines.py), unknown-word replacement,
vocabulary maps, and the Translator above a Session (translator.py)."""
