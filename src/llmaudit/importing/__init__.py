"""`llmaudit import` end to end (`pipeline`): the run store from a user's own training outputs (`llmaudit.ingest`),
what its records can decide (`llmaudit.planning.sizing`), then the blind baseline (`llmaudit.analyze.blind`)."""
