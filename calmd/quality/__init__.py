"""Measuring suggestions and the search: `calm replay` over real histories, and the offline fits of
the history and search rankers."""
