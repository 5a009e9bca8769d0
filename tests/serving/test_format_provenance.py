"""kvlab's SGLang line templates against SGLang's own source, where a reference venv is present
(``.ci/setup_reference.sh`` builds 0.5.16 and 0.5.23; ``KVLAB_REF_DIR`` points elsewhere): every literal piece of
each template must appear in that release's model runner, memory pool, scheduler or KV configurator."""

import re

import pytest

from kvlab.serving.sglang_formats import _BEGIN, _POOL_END, FORMATS
from tests.mem_cache.test_differential_sglang import require_reference

FILES = ("model_executor/model_runner.py", "mem_cache/memory_pool.py", "managers/scheduler.py",
         "mem_cache/kv_cache_configurator.py", "distributed/bootstrap.py")
# pieces SGLang builds from expressions: 0.5.23 f"{cache_name} {'VA upper bound' if ... else 'is allocated'}. ",
# 0.5.10+ f"{quant_str + ', ' if quant_str else ''}avail mem=" and f"{'available_cpu_mem' if ... else 'available_gpu_mem'}="
SPLIT = {"KV Cache is allocated. dtype: ": ("KV Cache", "is allocated", ". dtype: "),
         ", avail mem=": ("avail mem=",), ", available_gpu_mem=": ("'available_gpu_mem'",)}


def _pieces(template: str):
    for chunk in re.split(r"\{[^}]*\}", template):
        for piece in SPLIT.get(chunk, (chunk,)):
            if len(piece.strip(" ,.")) >= 4:
                yield piece


@pytest.mark.parametrize("version", ["0.5.16", "0.5.23"])
def test_templates_are_in_sglangs_source(version):
    python = require_reference(version)
    root = next(python.parent.parent.glob("lib/python3*/site-packages/sglang/srt"))
    source = "\n".join((root / f).read_text() for f in FILES if (root / f).exists())
    source = re.sub(r'"\s*\n\s*f?"', "", source)  # f"a " f"b" over two lines reads as "a b"
    fmt = FORMATS[version]
    templates = [_BEGIN, _POOL_END, fmt.load_end, fmt.tokens, fmt.init_dist, fmt.kv_alloc, fmt.kv_alloc_mla]
    missing = [piece for t in templates if t for piece in _pieces(t) if piece not in source]
    assert not missing, f"sglang {version} source lacks {missing}"
