"""The release of hframe this is (``hframe -V``, and what every pack and index records)."""

__version__ = "0.1.0"
