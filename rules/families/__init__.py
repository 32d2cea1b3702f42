"""The in-tree rule families, one module per concern; each module's ``FAMILIES`` lists the
``Family`` objects it adds rules to (``registry.IN_TREE_MODULES`` names them in table order)."""
