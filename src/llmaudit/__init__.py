"""llmaudit: how much does a quantized LLM leak about its fine-tuning data, and which quantizer leaks least.

Importing the package is cheap: it never imports torch backends such as bitsandbytes, gptqmodel or hqq.
"""

__version__ = "0.2.0"
