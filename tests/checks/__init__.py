"""Static checks of the whole repository: types, the import graph, the docs."""
