"""Security: authentication and permissions of calls (``auth`` and its parts), the
checks of hostile input (``limits`` and its parts), TLS settings, and the proof that a server
is a node of this cluster.
"""
