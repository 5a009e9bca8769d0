"""kvlab: a toolkit for learning and investigating LLM-serving KV memory."""

__version__ = "0.1.0"
