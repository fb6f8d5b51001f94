"""The gateway: an OpenAI-compatible front door that routes by model and wakes sleeping ones.

Choices a user can observe:
- A request waits for a wake only when no pod is Ready and labelled `awake`; it then costs at
  most one `snooze.dev/wake-requested-at` annotation per wake, per replica (`hold.wake_pending`).
- The wait shows: non-streaming answers carry `x-snooze-held-seconds`; a streaming request
  gets its 200 at once, `: waiting for model X to wake` comments every `--keepalive-seconds`,
  then `: held N.NNNs while the model woke` before the engine's first event.
- Every error the gateway makes itself is in OpenAI's shape; after an SSE has begun, an error
  is a final `data: {"error": ...}` event, which OpenAI's clients raise.
- Only connect errors are retried on another pod (nothing was sent); such a pod is avoided
  for a few seconds, since its awake label outlives it until the operator notices.
"""
