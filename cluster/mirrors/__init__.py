"""Mirror and source coordinators: one link per origin of a stream (``link``), kept in
line with the stream's config on its leader (``links``).
"""
