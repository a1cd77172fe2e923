"""The launcher's side of the process boundary: what runs in the process that starts and supervises
a deployment's units (`supervisor.Supervisor`, the `base.Launcher`s that start units as local
processes or Ray actors, the start-up handshake, restarts). The units' own code is in
`launch.unit_process`; what both sides share (the contract, the messages and their channel, the
health checks) is in `disaggsdk.launch` itself.
"""
