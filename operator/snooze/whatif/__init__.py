"""`snooze whatif`: the operator's own policy replayed over a request trace on a simulated clock."""
