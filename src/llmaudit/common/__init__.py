"""Building blocks every layer may use: atomic file I/O, the runtime (threads, devices, caches),
statistics and number formatting. Nothing here imports another llmaudit package.
"""
