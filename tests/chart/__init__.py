"""The Helm chart, rendered by real Helm."""
