"""The GPU pool decisions, pure: who wakes and who sleeps to make room on a shared device, and the
books a pool keeps between decisions."""
