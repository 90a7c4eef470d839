"""The coordinator role: membership, the start barrier, budgets, checkpoints, the policy host."""
