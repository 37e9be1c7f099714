"""The pure model of osas: ids, node-group specs, the inventory and sizing decisions.

Nothing here performs I/O or knows about gRPC, OpenStack or asyncio; every other layer builds on it.
"""
