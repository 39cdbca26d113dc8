"""Planning and tracking an audit: what a command works on (`targets`), what its design can decide (`sizing`),
what it will cost (`plan`, on `throughput` measured here), and where a run directory stands (`status`)."""
