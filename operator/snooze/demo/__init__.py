"""`snooze demo`: the whole system on one machine, a traffic scenario, a summary and a picture."""
