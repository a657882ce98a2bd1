"""SQL text -> bound logical plan: parsing (sqlglot), name resolution, subquery decorrelation."""
