"""Finding, loading and calling plugins: discovery, the registries, the typed facade."""
