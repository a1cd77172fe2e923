"""The KV messenger: the decode side and the prefill side of one request's KV handoff.

`protocol` frames the control messages, `write_plan` turns a route and a request's pages into
write batches, `context` packs the last prefilled position's hidden state and logits,
`decode_side` / `prefill_side` run the two halves on each instance's head process.
Nothing here is imported by ``import disaggsdk``.
"""
