"""GPU pools in the operator: one coordinator loop per GPUPool, the snapshot of its members it
reads, its status and what it tells."""
