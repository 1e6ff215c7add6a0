"""The meta group: the replicated definitions of streams and consumers (the meta state and
its parts, its entries and snapshots, the group on this node), placement, node descriptions,
and the record of repairs.
"""
