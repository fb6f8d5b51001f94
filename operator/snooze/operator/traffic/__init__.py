"""What the front doors tell the operator of each model's traffic: the Snooze gateway's replicas,
and the Inference Extension's endpoint pickers and their queues."""
