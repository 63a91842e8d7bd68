"""calmd: the server, its wire protocol, the fair scheduler, the completion engine and the history
ranker, the history search, the trainer's supervisor.
"""
