"""Documents, not lines: a text split into sentences with its layout kept (layout.py: plain text;
markdown.py: Markdown's markup left alone), the sentences of many documents decoded together,
repeats translated once (memory.py: a translation memory in SQLite), paragraph languages
detected (detect.py), and the translations joined back into the layout (translate.py)."""
