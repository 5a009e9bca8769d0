"""Explain a serving engine's start-up: parse SGLang / vLLM logs, recompute the KV pool, say why.

``explain_log(path, model_config=...)`` is the entry point (``kvlab explain-log`` on the command line).
"""

from kvlab.serving.explain import explain_log, explain_sglang
from kvlab.serving.result import Explanation
from kvlab.serving.sglang_log import LogError, parse_sglang_log, read_sglang_log

__all__ = ["Explanation", "LogError", "explain_log", "explain_sglang", "parse_sglang_log", "read_sglang_log"]
