"""The fuzz targets, one parser each (see fuzz/__init__.py)."""
