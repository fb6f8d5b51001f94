"""The operator, a kopf application: one loop per InferenceModel gathers facts, asks the policy
and acts on engines, pods and workloads, and reports on status, Events and metrics."""
