"""The sub-commands of ``qbroker``: one module each, with ``register(subparsers)``."""
