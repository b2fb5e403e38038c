"""RL / preference helpers: rewards (math verifier, format, user functions), token log-probs, toy tasks."""
