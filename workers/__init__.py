"""Provider and maintenance processes built on the public ``broker`` API."""
