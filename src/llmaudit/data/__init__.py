"""SMolInstruct records: sources (hub, local files, the offline generator), validation, tokenisation
through the chat template, and the pool / validation / membership draw.
"""
