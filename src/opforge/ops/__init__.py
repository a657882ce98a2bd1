"""The public tensor API. Importing a family registers its ops."""

from opforge.ops import elementwise  # noqa: F401

