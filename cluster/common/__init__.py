"""What every part of the node uses: clocks, durable and private files, names and group
ids, the answer-time rules of proposals, the mapping of Raft's errors, gRPC handler
rewrapping, and the node's metrics. The bottom layer of cluster/.
"""
