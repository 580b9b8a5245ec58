"""The asking side: an agent's ask, from the call to the answer it accepts."""

__all__: list[str] = []
