"""`snooze check`: whether Snooze will work on a cluster and with its engines, one line per check,
each ok, a warning or a failure with what to do."""
