"""Config: typed schemas, resolvers, and the trust check that guards what a config builds."""
