"""calmd: the server, its wire protocol, the fair scheduler, the completion engine and the history
ranker, the trainer's supervisor.
"""
