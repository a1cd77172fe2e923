"""What serves tokens behind the `ServingBackend` contract (`serve.backend`): one colocated engine in
process, or a spec's units as local processes behind a `Router` (`local`), and offline generation
over them.
"""
