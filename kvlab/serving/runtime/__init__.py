"""A server's runtime log: SGLang's per-step lines and vLLM's metrics read (``reader``), turned into a timeline
with the hit rate as SGLang computes it (``timeline``) and findings that name their lines (``findings``)."""
