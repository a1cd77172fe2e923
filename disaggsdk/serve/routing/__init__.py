"""The router and its requests' lifecycle: which unit serves a request (`unit_routing`,
`unit_routability`), each request's state from routing to its last token, the units' stats, and
the requests that take units down (`poison_requests`).
"""
