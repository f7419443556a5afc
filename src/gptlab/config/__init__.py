"""Config: schemas, resolvers, what a config may build."""
