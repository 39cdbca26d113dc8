"""`llmaudit score`: per-sample token losses of every (run, checkpoint, quantizer) unit."""
