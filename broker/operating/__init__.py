"""The operating side: housekeeping, the audit chain and read-only views of a namespace."""

__all__: list[str] = []
