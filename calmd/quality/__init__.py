"""Measuring suggestions: `calm replay` over real histories, and the offline fit of the history ranker."""
