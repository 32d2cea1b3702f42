"""PET-style partial-equivalence rules: the site-rule machinery (``partial``), its families, the
small models with one site each, and their verification at each site's concrete shapes."""
