"""What is loaded: model configs (KV bytes per token), checkpoints, and the weight loader."""

from kvlab.model.checkpoint import CheckpointError, MetaCheckpoint, SafetensorsCheckpoint, write_checkpoint
from kvlab.model.config import ModelConfig, WeightSpec
from kvlab.model.hf_config import MODEL_PRESETS, get_model_config
from kvlab.model.loader import LoadedWeights, WeightLoader, load_weights

__all__ = [
    "CheckpointError", "LoadedWeights", "MODEL_PRESETS", "MetaCheckpoint", "ModelConfig",
    "SafetensorsCheckpoint", "WeightLoader", "WeightSpec", "get_model_config", "load_weights", "write_checkpoint",
]
