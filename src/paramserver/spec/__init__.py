"""What a job is: the training configuration and the plan of a comparison."""
