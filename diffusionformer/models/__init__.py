"""Model families built from diffusion-attention blocks, with typed configs and named presets."""

from diffusionformer.models.common import ModelIntermediates, init_transformer_weights, learned_operator_parameters
from diffusionformer.models.dino import DINO, DINOConfig, DINOHead, dino_loss, knn_classify
from diffusionformer.models.gcn import GCN, GCNConfig
from diffusionformer.models.gin import GIN, GINConfig
from diffusionformer.models.gpt import DiffusionGPT, GPTConfig
from diffusionformer.models.graph_transformer import (
    DiffusionGraphTransformer,
    GraphBlock,
    GraphTransformerConfig,
    positional_encoding_transform,
)
from diffusionformer.models.registry import (
    ModelPreset,
    create_model,
    get_preset,
    list_models,
    model_config,
    register_model,
    unregister_model,
)
from diffusionformer.models.sampling import top_k_filter, top_p_filter
from diffusionformer.models.vit import DiffusionViT, ViTConfig, attention_rollout

__all__ = [
    "DINO",
    "DINOConfig",
    "DINOHead",
    "DiffusionGPT",
    "DiffusionGraphTransformer",
    "DiffusionViT",
    "GCN",
    "GCNConfig",
    "GIN",
    "GINConfig",
    "GPTConfig",
    "GraphBlock",
    "GraphTransformerConfig",
    "ModelIntermediates",
    "ModelPreset",
    "ViTConfig",
    "attention_rollout",
    "create_model",
    "dino_loss",
    "get_preset",
    "init_transformer_weights",
    "knn_classify",
    "positional_encoding_transform",
    "top_k_filter",
    "top_p_filter",
    "learned_operator_parameters",
    "list_models",
    "model_config",
    "register_model",
    "unregister_model",
]
