"""A team's settings: the declaration (``settings``), and reading a file with the place of
each problem (``load``)."""
