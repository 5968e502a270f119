"""Data that ships inside the package, so the default training run needs no network."""
