"""Rule verification: a rule's left-hand side read back from egglog (``rule_pattern``), concrete
instances of it (``rule_instances``, ``instance_sampling``) and the check on them (``verify``)."""
