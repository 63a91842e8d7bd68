"""calmd, the daemon: the server that wires it together (server.py) and its configuration
(config.py), the socket and its connections (transport.py), what each request means
(service.py), the fair scheduler (scheduler.py), the per-session COMP state (comp_state.py), the
history search's thread (search.py) and the trainer's supervisor (trainer.py). What a keystroke
gets is calmd/suggest's; the wire format is calmd/protocol.py; what `calmd status` draws is
calmd/cli/status_view.py.
"""
