"""Request tracing: each request's phases as OpenTelemetry spans, and the switch that decides, once,
whether requests are traced and where their spans go.
"""
