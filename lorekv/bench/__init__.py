"""The cost benchmark (``lorekv bench``)."""
