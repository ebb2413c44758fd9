"""Decoding: what to decode and how. The controls' table and the generation config (controls.py,
generation.py), the Request and Result (request.py), the strategies (strategies.py: greedy, beams,
sampling; constrained.py: beams that meet lexical constraints, tracked by constraints.py), the
logits processors and the one loop that steps them (loop.py)."""
