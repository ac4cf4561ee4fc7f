"""io/rollouts."""
