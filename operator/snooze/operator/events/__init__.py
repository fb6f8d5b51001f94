"""The operator's Events: told for a model or a pool, correlated as Kubernetes' own recorder does,
and written on the API."""
