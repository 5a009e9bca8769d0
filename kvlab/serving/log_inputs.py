"""What a pasted or uploaded start-up log implies about its own explanation: the model config, the GPU and the TP
size it was served with, and what it leaves for the user to choose.

A log is judged with its own inputs, never with what an earlier example left in the controls (issue 35):

- **model**: the name the log gives (SGLang's ``server_args model_path`` or the launch command's ``--model-path`` /
  ``--model``; vLLM's ``'model': ...`` or ``vllm serve MODEL``) where it maps to a model kvlab ships (a preset in
  ``kvlab/model/presets`` or a config under ``data/examples/models``); else the models with the architecture the
  log prints (SGLang's ``Load weight end. type=...``; any, for a vLLM log) that the log's own numbers allow: the cell
  size its K/V sizes (or vLLM's available memory over its tokens) give, the context length it prints, and — only
  to tell apart models with the same cell — the weights per rank against what loading took. One model left is the
  log's; none or several: the user is asked, with those several named;
- **GPU**: the product name the log prints (``GPU 0: NVIDIA H100 80GB HBM3``), or vLLM's ``total_gpu_memory``
  where exactly one GPU kvlab knows has that total; else the user is asked;
- **TP**: the log's ``tp_size`` (or the ranks it prints), as :mod:`kvlab.serving.explain` reads it.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field

from kvlab.errors import KvlabError
from kvlab.units import GiB

#: name endings that do not change a model's geometry (an instruction-tuned or converted checkpoint)
_TUNED = ("-instruct", "-chat", "-hf", "-it", "-base")
#: name endings of a quantized checkpoint: the same geometry, other weights; tried after the exact name
_QUANTIZED = ("-fp8", "-awq", "-gptq", "-int4", "-int8", "-w8a8", "-bf16")
#: how far the weights per rank of a model may be from what loading took to count as the served model's (a loader
#: holds a little more, finding 1 much more: only used to tell apart models the cell and context do not)
WEIGHTS_TOLERANCE = 0.2
_VLLM_MODEL = (re.compile(r"['\"]model['\"]\s*:\s*['\"]([^'\"]+)['\"]"), re.compile(r"\bvllm serve\s+([^\s-]\S*)"))
_VLLM_TOTAL = re.compile(r"total_gpu_memory \((\d+(?:\.\d+)?) ?GiB\)")


@dataclass(frozen=True)
class LogInputs:
    """The inputs a start-up log implies (``log_inputs``); ``None`` where the log does not say (the user chooses)."""

    engine: str  # "sglang" | "vllm"
    model: str | None  # a model kvlab ships: a preset name or a config path under data/ (serving.examples.QWEN_FP8)
    model_source: str  # how it was found, or why none was, in words
    gpu: str | None  # a kvlab GPU preset
    gpu_source: str
    tp_size: int | None
    named: str | None = None  # the model the log names, as printed (a path or a hub id)
    arch: str | None = None  # the architecture the log prints
    candidates: tuple[str, ...] = field(default=())  # the models the log's numbers allow, where not one

    @property
    def missing(self) -> tuple[str, ...]:
        """What the log leaves for the user to choose: "model config", "GPU"."""
        return tuple(what for what, value in (("model config", self.model), ("GPU", self.gpu)) if value is None)

    @property
    def signature(self) -> tuple:
        """What tells one server's log from another's: a log edited in place keeps it, another server's changes it."""
        return self.engine, self.named, self.arch, self.gpu_source, self.tp_size


@functools.lru_cache(maxsize=1)
def shipped_models() -> dict[str, dict]:
    """{model: its config.json} for every model config kvlab ships: the presets (by name) and the example
    configs under ``data/examples/models`` (by their path under data/, as ``serving.examples`` names them)."""
    from kvlab.model.hf_config import PRESET_DIR, preset_names, read_config_json
    from kvlab.serving.examples import DATA_DIR

    models = {name: read_config_json(PRESET_DIR / f"{name}.json") for name in preset_names()}
    for path in sorted((DATA_DIR / "examples" / "models").glob("*/config.json")):
        models[path.parent.relative_to(DATA_DIR).as_posix()] = read_config_json(path)
    return models


def load_shipped(model: str):
    """The ModelConfig of a model kvlab ships (a preset name, or a config path under data/)."""
    from kvlab.model.hf_config import load_model_config
    from kvlab.serving.examples import DATA_DIR

    path = DATA_DIR / model
    return load_model_config(path if path.exists() else model)


def normalized_name(name: str) -> str:
    """``/models/Meta-Llama-3-8B-Instruct/`` -> ``llama-3-8b``: the last part of a path or hub id, lower case,
    without the endings of a tuned checkpoint (quantized endings stay: see ``match_name``)."""
    base = name.strip().strip("'\"").rstrip("/").rsplit("/", 1)[-1].lower().replace("_", "-").removeprefix("meta-")
    while base.endswith(_TUNED):
        base = base[: -len(next(s for s in _TUNED if base.endswith(s)))]
    return base


def _names_of(model: str, data: dict) -> set[str]:
    names = {normalized_name(model)}
    if data.get("_name_or_path"):
        names.add(normalized_name(str(data["_name_or_path"])))
    return names


def match_name(named: str) -> tuple[str | None, str]:
    """(the shipped model a log's model name maps to or None, how): the exact name first, then without a
    quantized ending (the same geometry: the cell is right, the weights per rank are the shipped config's)."""
    base = normalized_name(named)
    models = shipped_models()
    for candidate, note in ((base, ""), (_unquantized(base), " (its quantized checkpoint's geometry; the weights "
                                                                "per rank are this config's)")):
        hits = [m for m, data in models.items() if candidate in _names_of(m, data)]
        if candidate and len(hits) == 1:
            return hits[0], f"the log names {named!r}: kvlab's {hits[0]}{note}"
    return None, f"the log names {named!r}, not a model kvlab ships"


def _unquantized(base: str) -> str:
    for ending in _QUANTIZED:
        if base.endswith(ending):
            return base[: -len(ending)]
    return ""


def _sglang_named(log) -> str | None:
    value = log.server_args.get("model_path")
    if value in (None, "", "None"):
        value = log.launch_args.get("model-path") or log.launch_args.get("model")
    return value if value and not value.startswith("$") else None  # "$MODEL_ID": a shell variable, no name


def _vllm_named(text: str) -> str | None:
    for pattern in _VLLM_MODEL:
        if m := pattern.search(text):
            return m.group(1)
    return None


def _explained(explain, model: str):
    """The log explained (``explain``: the parsed log's explanation for a model config) with ``model``, or None
    where it cannot be."""
    try:
        return explain(load_shipped(model))
    except KvlabError:
        return None


def _fits(exp, context: int | None) -> bool:
    """``exp`` (the log with one model) agrees with the log's own numbers: its cell with the K/V sizes the log
    prints, its context length with the one the log prints (where the launch did not set it)."""
    if exp is None or any(f.id == "cell_mismatch" for f in exp.findings):
        return False
    return context is None or exp.model_config.context_len in (None, context)


def _weights_fit(exp) -> bool:
    loaded = exp.weights_gib if exp.engine == "sglang" else exp.extra.get("weights_gib")
    config = exp.model_config
    if loaded is None or config.lacks():
        return False
    expected = config.weight_bytes_per_rank(exp.tp_size) / GiB
    return abs(loaded - expected) <= WEIGHTS_TOLERANCE * expected


def _by_evidence(explain, arch: str | None, context: int | None) -> tuple[str | None, tuple, str]:
    """(model, candidates, how) from the architecture and the log's own numbers."""
    models = [m for m, data in shipped_models().items() if arch is None or arch in (data.get("architectures") or ())]
    if not models:
        return None, (), f"no model kvlab ships has the log's architecture {arch}"
    explained = {m: _explained(explain, m) for m in models}
    fitting = [m for m in models if _fits(explained[m], context)]
    by = ("architecture " + arch if arch else "no architecture printed") + (f", context {context:,}" if context else "")
    if len(fitting) > 1:
        by_weights = [m for m in fitting if _weights_fit(explained[m])]
        if len(by_weights) == 1:
            return by_weights[0], (), (f"the log's numbers ({by}, its cell size, and what loading took) fit only "
                                       f"kvlab's {by_weights[0]} of {', '.join(fitting)}")
    if len(fitting) == 1:
        return fitting[0], (), f"the log's numbers ({by} and its cell size) fit only kvlab's {fitting[0]}"
    if not fitting:
        return None, (), f"the log's numbers ({by} and its cell size) fit no model kvlab ships"
    return None, tuple(fitting), f"the log's numbers ({by}) fit several models kvlab ships: {', '.join(fitting)}"


def _gpu(gpu_name: str | None, text: str) -> tuple[str | None, str]:
    from kvlab.device.spec import DEVICE_PRESETS, find_device_spec
    from kvlab.serving.engine_compare import torch_total

    if gpu_name:
        spec = find_device_spec(gpu_name)
        return ((spec.name, f"the log prints {gpu_name!r}") if spec
                else (None, f"the log prints {gpu_name!r}, not a GPU kvlab knows"))
    if m := _VLLM_TOTAL.search(text):
        total = float(m.group(1))
        hits = [n for n, spec in DEVICE_PRESETS.items() if abs(torch_total(spec).gib - total) < 0.006]  # printed to 2 decimals
        if len(hits) == 1:
            return hits[0], f"the log's total_gpu_memory ({total} GiB)"
        return None, f"the log's total_gpu_memory ({total} GiB) is not the total of exactly one GPU kvlab knows"
    return None, "the log names no GPU"


def log_inputs(text: str, name: str = "the log") -> LogInputs:
    """The model, GPU and TP size ``text`` (an SGLang or vLLM start-up log) implies; a LogError where it is no
    start-up log kvlab reads (the same one ``explain_text`` raises)."""
    from kvlab.serving.explain import explain_sglang, require_readings, tp_size_of
    from kvlab.serving.sglang_log import parse_sglang_log
    from kvlab.serving.vllm_explain import explain_vllm
    from kvlab.serving.vllm_log import looks_like_vllm, parse_vllm_log

    log = parse_sglang_log(text, name)  # parsed once: each model tried explains the parsed log
    if not log.ranks and looks_like_vllm(text):
        vllm = parse_vllm_log(text, name)
        if not vllm.available_gib:
            explain_vllm(vllm)  # raises what the log lacks, as the explanation would
        explain = functools.partial(explain_vllm, vllm)
        engine, named, arch, gpu_name = "vllm", _vllm_named(text), None, None
        tp = vllm.tp_size or (1 + max(vllm.available_gib) if vllm.available_gib else None)
        context = None if "max_model_len" in text else vllm.max_model_len
    else:
        require_readings(log, [r for r in log.ranks.values() if r.before_gib is not None and r.after_gib is not None])
        explain = functools.partial(explain_sglang, log)
        engine, named, arch, gpu_name = "sglang", _sglang_named(log), log.arch, log.gpu_name
        tp = tp_size_of(log)[0]
        set_context = log.setting("context_length")[0]
        context = None if set_context is not None else _int(log.tokens_fields.get("context_len"))
    model, how = match_name(named) if named else (None, "the log names no model")
    candidates = ()
    if model is None:
        model, candidates, by = _by_evidence(lambda config: explain(model_config=config), arch, context)
        how = f"{how}; {by}"
    gpu, gpu_how = _gpu(gpu_name, text)
    return LogInputs(engine, model, how, gpu, gpu_how, tp, named, arch, candidates)


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None
