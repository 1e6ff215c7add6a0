"""Repair after data loss: detecting damaged Raft data at start, quarantining it and
rejoining fresh (``repair``), the meta leader's steps of a repair (``steps``), and what tells
a node that lost its data from a new one (``known_peers``).
"""
