"""The gRPC servicers of the client API and the node API, and what they share: the
service context, the cluster's nodes and addresses, forwarding to leaders, the meta group's
membership changes, and the conversion of values to messages.
"""
