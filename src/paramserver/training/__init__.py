"""What worker and evaluator processes run: tasks, the training loop, pacing."""
