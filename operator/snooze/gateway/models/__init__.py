"""The models the gateway knows, from its watches of InferenceModels and pods, and the wait for
their wake: one wake request per model, and the requests held until a pod is awake."""
