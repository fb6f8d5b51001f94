"""One InferenceModel's loop and what it calls: its probes, the policy's actions carried out on its
engines, wake integrity, its workload's scale and its status writes."""
