"""The cache kinds' inventories: how each tool lays out, verifies and removes its entries."""
