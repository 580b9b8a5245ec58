"""The web provider: a page (and JSON API) where a team answers its agents' questions.

``command`` is ``qbroker web``; the page is ``app``, its provider ``service``, its users ``config``.
The package imports nothing itself, so ``qbroker --help`` does not load the web stack.
"""
