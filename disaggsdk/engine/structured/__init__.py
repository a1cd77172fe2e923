"""Structured output on the decode side: what a request asks for (`output.StructuredOutput`, plain
values that cross process boundaries) and the per-request grammar state that masks its logits
(`grammar.GrammarState`, llguidance)."""
