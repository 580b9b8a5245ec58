"""The answering side: a provider's lease, the cards it shows and the answers it settles."""

__all__: list[str] = []
