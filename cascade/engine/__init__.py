"""Generation (rollout side) and log-prob computation (learner side) over one batch layout."""
